"""What ranks must agree on, checked with 2 real gloo ranks (two subprocesses, one host).

- `Ranks.from_rank0`: rank 0 alone decides (which checkpoint to resume), every rank gets its
  answer, and an exception rank 0 raises is raised on every rank (none is left waiting);
- `Ranks.gather_strided`: per-prompt eval scores of the `[rank::world]` shares back in prompt
  order on every rank, also when a rank's share is shorter or empty;
- the exact acceptance's micro-batches: ZeRO-3 needs the same module calls in the same order on
  every rank, so slices of different sizes (as many of them) fall back to plain slices;
- the step's rollout metrics are over all ranks' samples (the longest completion included),
  and DistillSparse's loss terms are summed over ranks (`Ranks.sums`);
- `rank_seed`: rank 0 keeps the configured seed, other ranks get other sampler streams.
"""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from hang_guard import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]

CHECK = textwrap.dedent(
    """
    import threading, torch, torch.distributed as dist
    from sparrow.distributed import Ranks, rank_seed
    from types import SimpleNamespace as NS
    from sparrow.monitor.exact_acceptance import _micro_batches
    from sparrow.train.step_report import rollout_metrics
    from sparrow.train.run.stored_config import ResumeMismatch

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = Ranks(rank, world)

    calls = []
    def decide():
        calls.append(rank)
        return f"step_{rank}"
    assert ranks.from_rank0(decide) == "step_0"
    assert calls == ([0] if rank == 0 else []), calls

    def mismatch():
        raise ResumeMismatch("run dir holds another config")
    try:
        ranks.from_rank0(mismatch)
        raise AssertionError("no exception")
    except ResumeMismatch as err:
        assert str(err) == "run dir holds another config", err

    def unpicklable():
        err = RuntimeError("disk gone")
        err.lock = threading.Lock()
        raise err
    try:
        ranks.from_rank0(unpicklable)
        raise AssertionError("no exception")
    except RuntimeError as err:
        assert "disk gone" in str(err), err

    whole = [0.0, 1.0, 1.0, 0.0, 1.0]  # 5 prompts: rank 0 holds 3, rank 1 holds 2
    assert ranks.gather_strided(whole[rank::world]) == whole
    assert ranks.gather_strided([7.0] if rank == 0 else []) == [7.0]  # rank 1: no prompts

    # 8 rows, micro-batches of up to 6 rows: rank 0 has 4 groups of 2 (slices 6 + 2 rows),
    # rank 1 two groups of 4 (4 + 4 rows): 2 slices each, but not the same calls.
    runs = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3] if rank == 0 else [0, 0, 0, 0, 1, 1, 1, 1])
    got = _micro_batches(runs, 6)
    assert got == [slice(0, 6), slice(6, 8)], got
    same = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])  # equal structures keep the shared slices
    assert _micro_batches(same, 6) == [slice(0, 6), slice(6, 8)]

    lengths = [2, 3] if rank == 0 else [5, 1]  # completion tokens of this rank's 2 rows
    mask = torch.tensor([[True] * n + [False] * (6 - n) for n in lengths])  # (2, 6)
    batch = NS(completion_mask=mask, prompt_lens=torch.tensor([4, 4]))
    scores = NS(scores=torch.tensor([1.0, 0.0] if rank == 0 else [1.0, 1.0]))
    outputs = [NS(finish_reason="stop"), NS(finish_reason="length" if rank else "stop")]
    m = rollout_metrics(batch, scores, outputs, ranks)
    assert m["len/completion_max"] == 5.0, m  # rank 1's row, on rank 0 too
    assert m["len/completion_mean"] == 11 / 4 and m["reward/mean"] == 3 / 4, m
    assert m["len/truncated_frac"] == 1 / 4, m

    # DistillSparse's loss terms: each rank's share of a global-token mean, summed over ranks.
    shares = {"distill/loss": 0.25 + rank, "distill/k3": 0.5}
    assert ranks.sums(shares) == {"distill/loss": 1.5, "distill/k3": 1.0}

    assert rank_seed(5, 0) == 5 and rank_seed(5, 1) != 5
    dist.destroy_process_group()
    print("ok")
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_agree():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    path = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE="2",
        PYTHONPATH=path,
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHECK],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        outs = [p.communicate(timeout=HANG_GUARD_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0 and "ok" in out, f"rank {rank}: {err[-3000:]}"


def test_paired_delta_needs_prompts_and_restarts_when_they_change():
    """The trainer's eval delta on the gathered scores: no prompts anywhere gives nothing (a
    rank's empty share used to raise), and a resumed run with another rl.eval.num_prompts takes
    its first evaluation as the new baseline instead of raising on unequal lists."""
    from sparrow.train.evaluation import PairedBaseline

    baseline = PairedBaseline()
    assert baseline.delta([]) == {}
    assert baseline.scores is None
    assert baseline.delta([0.0, 1.0, 0.0]) == {}
    delta = baseline.delta([1.0, 1.0, 0.0])
    assert delta["eval/delta"] == 1.0 / 3
    assert baseline.delta([1.0, 1.0]) == {}  # 2 prompts now: new baseline
    assert baseline.scores == [1.0, 1.0]


def test_each_rank_samples_its_own_stream(tmp_path, monkeypatch):
    """The trainer seeds its engine per rank (the launcher's RANK) from the run's `seed`, and
    rank 1 draws other completions for the same prompt (with one seed everywhere, row i of every
    rank drew the same random numbers); an explicit rollout.engine.seed keeps rank 0 at it."""
    from fake_actor import FakeActor

    from sparrow.cli.config_loader import load_config
    from sparrow.distributed import rank_seed
    from sparrow.rollout.engine import SamplingParams
    from sparrow.train.run.seeds import stream_seed
    from sparrow.train.trainer import GRPOTrainer

    cfg = load_config(["preset=tiny", "rl.eval.every=0", f"run_dir={tmp_path}"])
    params = SamplingParams(temperature=1.0, max_tokens=8)
    completions = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        trainer = GRPOTrainer.from_config(cfg, make_actor=FakeActor)
        assert trainer.engine.cfg.seed == stream_seed(cfg.seed, "sampling", rank)
        prompt = trainer.train_data.prompts[0].token_ids
        completions[rank] = [o.token_ids for o in trainer.engine.generate([prompt], params, n=4)]
    assert completions[0] != completions[1]
    assert rank_seed(5, 0) == 5 and rank_seed(5, 1) != 5  # the explicit seed's rank streams
