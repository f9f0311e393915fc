"""`sparrow-bench kernel` runs on CPU and writes the documented JSON rows."""

import json
import shutil

import pytest

from sparrow.bench import cli

REQUIRED = {"backend", "context_tokens", "budget_tokens", "sparse_ms", "dense_ms", "speedup"}


# auto on CPU: the fused C++ kernel wherever a compiler is installed (then no per-phase times).
AUTO = "cpp" if shutil.which("c++") else "torch"


@pytest.mark.parametrize("backend, resolved", [("torch", "torch"), ("auto", AUTO)])
def test_kernel_bench_writes_rows(tmp_path, capsys, backend, resolved):
    path = tmp_path / "kernel.json"
    argv = ["kernel", "--contexts", "256", "512", "--budgets", "64", "--iters", "1"]
    assert cli.main([*argv, "--batch", "2", "--backend", backend, "--json", str(path)]) == 0
    rows = json.loads(path.read_text())
    assert [(r["context_tokens"], r["budget_tokens"]) for r in rows] == [(256, 64), (512, 64)]
    for row in rows:
        assert REQUIRED <= row.keys() and row["backend"] == resolved
        assert (row["select_ms"] is None) == (resolved == "cpp")
        assert row["speedup"] == row["dense_ms"] / row["sparse_ms"]
        # 4 of 16 / 32 pages of K and V, plus the Quest summaries (fp32 min and max per page).
        pages = row["context_tokens"] // 16
        assert row["sparse_decode_bytes"] * pages == row["dense_bytes"] * 4
        assert row["sparse_bytes"] > row["sparse_decode_bytes"]
    assert "context_tokens=512" in capsys.readouterr().out


def test_cli_rejects_unknown_benchmark(capsys):
    assert cli.main(["nope"]) == 2
    assert "usage: sparrow-bench" in capsys.readouterr().err
