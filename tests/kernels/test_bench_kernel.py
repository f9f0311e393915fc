"""`sparrow-bench kernel` runs on CPU and writes the documented JSON rows."""

import json

from sparrow.bench import cli

REQUIRED = {"backend", "context_tokens", "budget_tokens", "sparse_ms", "dense_ms", "speedup"}


def test_kernel_bench_writes_rows(tmp_path, capsys):
    path = tmp_path / "kernel.json"
    argv = ["kernel", "--contexts", "256", "512", "--budgets", "64", "--iters", "1"]
    assert cli.main([*argv, "--batch", "2", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())
    assert [(r["context_tokens"], r["budget_tokens"]) for r in rows] == [(256, 64), (512, 64)]
    for row in rows:
        assert REQUIRED <= row.keys() and row["backend"] == "torch"
        assert row["speedup"] == row["dense_ms"] / row["sparse_ms"]
        # 4 of 16 / 32 pages of K and V, plus the Quest summaries (fp32 min and max per page).
        pages = row["context_tokens"] // 16
        assert row["sparse_decode_bytes"] * pages == row["dense_bytes"] * 4
        assert row["sparse_bytes"] > row["sparse_decode_bytes"]
    assert "context_tokens=512" in capsys.readouterr().out


def test_cli_rejects_unknown_benchmark(capsys):
    assert cli.main(["nope"]) == 2
    assert "usage: sparrow-bench" in capsys.readouterr().err
