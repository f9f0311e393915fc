"""`sparrow-bench kernel-check` (the GPU check's numeric check before the timed headline): its
comparison on planted data, its run over every decode-step kernel in both dtypes (the
interpreter on a CPU, compiled on a GPU), and a planted wrong kernel result failing it, naming
that kernel and no other."""

import json

import pytest
import torch

from sparrow.bench import cli
from sparrow.bench.kernel_check import compare

KERNELS = {"add_rms_norm", "qk_norm_rope", "silu_mul", "write_kv", "page_scores", "select_pages",
           "paged_decode"}  # fmt: skip


def test_compare_passes_within_tolerance_and_fails_outside_or_on_nan():
    ref = torch.tensor([1.0, -2.0, 4.0])
    ok = compare("k", "c", torch.float32, ref + torch.tensor([0.0, 0.01, -0.04]), ref, 0.0, 0.01)
    assert ok["ok"] and ok["mismatched"] == 0 and ok["max_abs_err"] == pytest.approx(0.04)
    off = compare("k", "c", torch.float32, ref + torch.tensor([0.0, 0.03, 0.0]), ref, 0.0, 0.01)
    assert not off["ok"] and off["mismatched"] == 1  # 0.03 > 0.01 * |-2|
    assert compare("k", "c", torch.float32, ref + 0.5, ref, 0.5, 0.0)["ok"]  # atol: absolute
    nan = ref.clone()
    nan[2] = float("nan")
    found = compare("k", "c", torch.bfloat16, nan, ref, 1.0, 1.0)
    assert not found["ok"] and found["nonfinite"] == 1 and found["dtype"] == "bfloat16"
    assert not compare("k", "c", torch.float32, nan, nan, 1.0, 1.0)["ok"]  # NaN never passes
    exact = torch.tensor([3, 5, 7])
    assert compare("k", "c", torch.int32, exact, exact, 0.0, 0.0)["ok"]
    assert not compare("k", "c", torch.int32, exact.flip(0), exact, 0.0, 0.0)["ok"]
    shape = compare("k", "c", torch.float32, ref[:2], ref, 1.0, 1.0)
    assert not shape["ok"] and "shape" in shape["error"]


def run_check(tmp_path, *args: str) -> tuple[int, dict]:
    path = tmp_path / "kernel_check.json"
    rc = cli.main(["kernel-check", "--seed", "3", "--json", str(path), *args])
    return rc, json.loads(path.read_text())


def test_every_decode_step_kernel_matches_its_reference_in_both_dtypes(tmp_path):
    rc, report = run_check(tmp_path, "--dtypes", "bfloat16", "float32")
    assert rc == 0 and report["failed"] == [], report["failed"]
    checks = report["checks"]
    assert {c["kernel"] for c in checks} == KERNELS
    # The norm kernels run in half precision only (an fp32 model takes torch's ops).
    by_dtype = {d: {c["kernel"] for c in checks if c["dtype"] == d} for d in report["dtypes"]}
    assert by_dtype == {"bfloat16": KERNELS, "float32": KERNELS - {"add_rms_norm", "qk_norm_rope"}}
    decode = {c["case"] for c in checks if c["kernel"] == "paged_decode"}
    assert decode == {f"{arm}, {s}" for arm in ("dense", "sparse")
                      for s in ("auto splits", "1 split", "4 splits")}  # fmt: skip
    assert all(c["ok"] and c["nonfinite"] == 0 and c["elements"] > 0 for c in checks)
    assert report["seed"] == 3 and report["interpreted"] == (report["device"] == "cpu")


def _perturbed(fn, index=0):
    """`fn` whose (first) output has one element changed by a visible amount."""

    def wrong(*args, **kwargs):
        out = fn(*args, **kwargs)
        target = out[index] if isinstance(out, tuple) else out
        target.view(-1)[1] += 0.5 + target.view(-1)[1].abs()
        return out

    return wrong


def _skipping_last_row(fn):
    """A KV write that leaves its last token unwritten."""

    def wrong(k_cache, v_cache, k, v, slot_mapping, summary=None):
        return fn(k_cache, v_cache, k[:-1], v[:-1], slot_mapping[:-1], summary)

    return wrong


def _swapping_choice(fn):
    """A page choice whose first row's first two slots trade places."""

    def wrong(*args, **kwargs):
        chosen = fn(*args, **kwargs)
        pages = chosen.logical_pages
        pages[0, 0, :2] = pages[0, 0, :2].flip(0).clone()
        return chosen

    return wrong


PLANTS = {
    "paged_decode": ("decode_triton", "paged_decode_triton", _perturbed),
    "silu_mul": ("swiglu_triton", "silu_mul", _perturbed),
    "add_rms_norm": ("norm_rope_triton", "add_rms_norm", lambda f: _perturbed(f, index=1)),
    "write_kv": ("kv_write_triton", "write_kv", _skipping_last_row),
    "select_pages": ("select_triton", "select_pages_triton", _swapping_choice),
}


@pytest.mark.parametrize("kernel", sorted(PLANTS))
def test_a_planted_wrong_kernel_result_fails_the_check(kernel, tmp_path, monkeypatch):
    module_name, launcher, plant = PLANTS[kernel]
    module = __import__(f"sparrow.kernels.{module_name}", fromlist=[launcher])
    monkeypatch.setattr(module, launcher, plant(getattr(module, launcher)))
    # The CPU default: one sparse and one dense row in the headline's dtype (every kernel).
    rc, report = run_check(tmp_path, "--dtypes", "bfloat16", "--rows", "2", "--budget-pages", "4")
    assert rc == 1
    failed = {c["kernel"] for c in report["checks"] if not c["ok"]}
    assert failed == {kernel}, report["failed"]
    assert report["failed"] and all(line.startswith(kernel) for line in report["failed"])
