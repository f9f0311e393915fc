"""Every `sparrow-bench` subcommand runs end to end at a tiny shape on the CPU and writes the JSON
its documents read: exit 0, the fields a table or figure takes from it present, and no arm that
reports an error or a problem there (`error`, `errors`, `problems`).

`distill-attention`'s masked arm crashed in its subprocess from add4229 to 53571e2 while the
bench still exited 0 with the gather arm alone: a failed arm must fail the bench and this test.
A subcommand added to `sparrow.bench.cli.COMMANDS` fails `test_every_subcommand_has_a_tiny_run`
until it has a tiny run here. A default-suite run takes seconds on an idle 2-core CPU (up to a
minute while others load it); nothing about speed is asserted
(the figures come from runs at full size, see the documents named with each run).
"""

import json
from typing import NamedTuple

import pytest

from sparrow.bench import cli
from sparrow.bench.cli import COMMANDS


class Run(NamedTuple):
    """One tiny run of a subcommand: its command line (JSON_PATH: the run's output file; a run
    without it prints its JSON as its last stdout line, as `actor` does), the JSON fields that
    must hold a value, dotted (`*`: every item of a list, every value of a dict), and whether it
    is left to `-m slow` (a mode, an arm or a size that costs a minute on 2 cores: Triton's
    interpreter and its sm_90 compile, two DeepSpeed actors, four distill-attention processes, the
    in-process timing and the pipeline's 2-rank launches; every subcommand has a default-suite
    run as well)."""

    command: str
    fields: str
    slow: bool = False


# Each subcommand's runs, beside the document that reads their fields.
TINY: dict[str, list[Run]] = {
    "actor": [  # tests/train/memory/test_plan.py: the update's growth beside the estimate
        Run("actor memory 2 0", "micro_batch_rows peak_rss_growth_mib estimate_mib"),
        Run("actor prefix --tiny --repeats 1", "compute_logprobs.ratio train_step.ratio", True),
    ],
    "decode-step": [  # docs/gpu/README.md: step_ms per arm, their ratio, the KV bytes
        Run(
            "decode-step --iters 2 --warmup 1 --json JSON_PATH",
            "runs.*.sparse.step_ms runs.*.dense.step_ms runs.*.ratio ratio.* weights_bytes "
            "runs.*.kv_bytes.read_per_step_sparse",
        ),
    ],
    "decode": [  # docs/bench_decode/README.md: launches per layer, syncs, page table, GPU splits
        Run(
            "decode --backends torch --dtypes float32 --lens 40 33 --pt-seqs 4 --pt-pages 8 "
            "--json JSON_PATH",
            "launches_per_layer_sparse launches_per_layer_dense host_syncs_per_step "
            "host_syncs_per_step_whole_call page_table_update_ms page_table_rebuild_ms "
            "runs.*.sparse_step.launches_total",
        ),
        Run(
            "decode --backends triton --dtypes bfloat16 --triton-lens 40 --pt-seqs 0 "
            "--json JSON_PATH",
            "launches_per_layer_sparse launches_per_layer_dense host_syncs_per_step "
            "cuda.shapes.*.launches_per_layer_sparse cuda.merge_below_batch",
            slow=True,
        ),
    ],
    "dense-shared": [  # its own printout: decode tok/s of each path and their ratio
        Run(
            "dense-shared --model tiny-qwen3 --context 40 --samples 2 --new-tokens 3 --rounds 1 "
            "--page-size 8 --json JSON_PATH",
            "kernel.decode_tok_s copies.decode_tok_s ratio fused_kernel",
        ),
    ],
    "distill-attention": [  # docs/distill/README.md: step memory per arm and T, time
        Run(
            "distill-attention --lengths 128 --budget-tokens 32 --time-length 0 --json JSON_PATH",
            "memory.*.step_mib gather_over_masked.128",
        ),
        Run(
            "distill-attention --lengths 128 192 --budget-tokens 32 --time-length 128 "
            "--repeats 1 --json JSON_PATH",
            "memory.*.step_mib growth.gather growth.masked gather_over_masked.* "
            "time.median_s.gather time.median_s.masked time.masked_over_gather",
            slow=True,
        ),
    ],
    "kernel": [  # README's results table (decode row) and the bench's goals
        Run(
            "kernel --contexts 256 --budgets 64 --iters 1 --batch 1 --json JSON_PATH",
            "*.sparse_ms *.dense_ms *.speedup *.sparse_bytes *.dense_bytes",
        ),
    ],
    "kernel-check": [  # docs/gpu/README.md: the kernels stage's numeric check
        Run(
            "kernel-check --dtypes bfloat16 --json JSON_PATH",
            "checks.*.ok checks.*.max_abs_err checks.*.mismatched shapes.head_dim seed",
        ),
    ],
    "pipeline": [  # docs/pipeline/README.md: steps at staleness 0 vs 1, overlap, step ratio
        Run(
            "pipeline --steps 2 --json JSON_PATH preset=tiny",
            "sync.steps.*.wall_s async1.steps.*.wall_s sync_step_s async_step_s step_speedup "
            "overlap_s",
        ),
        Run(  # two 2-rank launches: 1 rollout + 1 training rank vs 2 colocated ranks
            "pipeline --steps 2 --layouts --json JSON_PATH preset=tiny",
            "layouts.colocated2.steps.*.step_s layouts.rollout1_train1.steps.*.step_s "
            "layouts.rollout1_train1.steps.*.phases.sync/push_bytes layouts.layout_speedup",
            slow=True,
        ),
    ],
    "prefix": [  # the bench's own table
        Run(
            "prefix --model tiny-qwen3 --prompts 2 --few-shot 1 --new-tokens 2 --json JSON_PATH",
            "prefix_tokens shared_s full_s ratio same_tokens",
        ),
    ],
    "push": [  # the report's push time and bytes per bucket size (issue 51 item 3)
        Run(
            "push --model tiny-llama --bucket-mb 0.01 1 --repeats 1 --json JSON_PATH",
            "colocated_s buckets.*.send_s buckets.*.receive_s buckets.*.bytes "
            "buckets.*.messages buckets.*.push_vs_colocated",
        ),
    ],
    "rollout": [  # docs/bench_rollout/README.md: engine / HF, sparse / dense, p5
        Run(
            "rollout --model tiny-qwen3 --batch 1 --prompt-tokens 8 --new-tokens 2 "
            "--context 128 --sparse-batch 1 --sparse-new-tokens 2 --budget-tokens 48 "
            "--json JSON_PATH",
            "engine_vs_hf.engine_tok_s engine_vs_hf.hf_tok_s engine_vs_hf.ratio "
            "sparse_vs_dense.sparse_tok_s sparse_vs_dense.dense_tok_s sparse_vs_dense.ratio "
            "sparse_vs_dense.p5_acceptance",
        ),
    ],
    "speculative": [  # docs/speculative/README.md: tok/s per arm, ratios, acceptance, best k
        Run(
            "speculative --model tiny-qwen3 --contexts 96 --batch 2 --new-tokens 6 "
            "--budget-tokens 48 --draft-tokens 2 3 --repeats 1 --json JSON_PATH",
            "contexts.*.tok_s.* contexts.*.vs_dense.* contexts.*.acceptance.* "
            "contexts.*.tokens_per_verify.* contexts.*.best_k contexts.*.step_ms.*.decode "
            "contexts.*.cost.spec_k2.verify_in_dense_steps contexts.*.cost.spec_k3.* "
            "contexts.*.cost.sparse_in_dense_steps",
        ),
    ],
    "step": [  # docs/bench_step/README.md: both runs' phases, KV-read, p5, the speedups
        Run(
            "step --random-model qwen3-debug --json JSON_PATH preset=tiny "
            "rl.prompts_per_step=1 rollout.max_new_tokens=8",
            "sparse.rollout_s sparse.monitor_s sparse.update_s sparse.step_s "
            "sparse.prefill_s sparse.decode_s sparse.kv_read_ratio sparse.accept_p5_min "
            "dense.rollout_s dense.step_s rollout_speedup step_speedup step_speedup_excl_monitor",
        ),
    ],
}


def lookup(report, path: str) -> list:
    """The values at a dotted path; `*` fans out over a list's items or a dict's values."""
    values = [report]
    for key in path.split("."):
        step = []
        for value in values:
            if key == "*":
                step += list(value.values() if isinstance(value, dict) else value)
            elif isinstance(value, dict) and key in value:
                step.append(value[key])
            else:
                return []
        values = step
    return values


def reported_errors(report, where: str = "") -> list[str]:
    """Every non-empty `error`, `errors` or `problems` entry anywhere in the report."""
    found = []
    if isinstance(report, dict):
        for key, value in report.items():
            if key in ("error", "errors", "problems") and value:
                found.append(f"{where}{key}: {value}")
            else:
                found += reported_errors(value, f"{where}{key}.")
    elif isinstance(report, list):
        for i, value in enumerate(report):
            found += reported_errors(value, f"{where}{i}.")
    return found


def test_every_subcommand_has_a_tiny_run():
    assert set(TINY) == set(COMMANDS)


def test_lookup_and_errors_read_nested_reports():
    report = {"runs": [{"a": {"ms": 1}}, {"a": {"ms": 2}}], "rows": {"x": {"error": "boom"}}}
    assert lookup(report, "runs.*.a.ms") == [1, 2]
    assert lookup(report, "runs.*.b") == []
    assert reported_errors(report) == ["rows.x.error: boom"]
    assert reported_errors({"problems": [], "errors": [], "skipped": "--flag"}) == []


RUNS = [
    pytest.param(run, id=f"{name}-{i}", marks=[pytest.mark.slow] if run.slow else [])
    for name in sorted(TINY)
    for i, run in enumerate(TINY[name])
]


def test_every_subcommand_runs_in_the_default_suite():
    assert {name for name, runs in TINY.items() if any(not run.slow for run in runs)} == set(TINY)


@pytest.mark.parametrize("run", RUNS)
def test_subcommand_runs_and_writes_its_json(run, tmp_path, capsys, monkeypatch):
    command, fields = run.command, run.fields
    name = command.split()[0]
    path = tmp_path / f"{name}.json"
    argv = command.replace("JSON_PATH", str(path)).split()
    monkeypatch.setenv("SPARROW_CACHE", str(tmp_path / "cache"))  # step's saved random model
    monkeypatch.chdir(tmp_path)
    code = cli.main(argv)
    out = capsys.readouterr().out
    assert code == 0, f"sparrow-bench {command} exited {code}: {out[-2000:]}"
    if "JSON_PATH" in command:
        report = json.loads(path.read_text())
    else:
        report = json.loads(out.strip().splitlines()[-1])
    assert reported_errors(report) == []
    missing = [f for f in fields.split() if not lookup(report, f)]
    assert missing == [], f"the JSON lacks {missing}: {json.dumps(report)[:3000]}"
    empty = [f for f in fields.split() if any(v is None for v in lookup(report, f))]
    assert empty == [], f"the JSON has no value for {empty}"
