"""The offline tail of a finished DistillSparse run: per position bin, the exact acceptance of
held-out generations with and without the run's trained adapter, on the same tokens.

From the run's artefacts (its config, the adapter in its newest complete checkpoint, theta as
exported to `policy/`): held-out prompts are sampled under a fixed schedule (the budgets the
controller settled at) twice, once by the sparse policy with the adapter and once without it.
Each sample set is scored both ways against the dense policy (theta, dense decode), so each
comparison is paired: the same prompts and the same sampled tokens, acceptance with phi and
without. Acceptance is exact, sum_v min(p_dense, q_sparse) over the full vocabulary, pooled per
position bin as the monitor pools it. The sampling policy's own logits come from the generation
(`return_logits`); one teacher-forced replay gives the dense logits and the other sparse policy's
(dense rows are decoded densely, where a gated adapter never acts).

    tail = offline_tail(cfg, Path("runs/distill/adapter_s0"), budgets_pages=[16, 24])
"""

from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from sparrow.control.acceptance import bin_acceptance, exact_acceptance
from sparrow.control.kv_read import dense_pages
from sparrow.control.schedule import BudgetSchedule
from sparrow.distill.distill_sparse import DistillSparse
from sparrow.models.loading import load_model
from sparrow.rollout.engine import LLMEngine, SamplingParams, Schedule
from sparrow.tasks.data import load_eval_prompts
from sparrow.train.config import SparrowConfig
from sparrow.train.run.checkpoint import verify

PROMPTS_PER_CALL = 4  # prompts sampled and scored at once: bounds the (T, V) logits held


def newest_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint of a run (its adapter and controller state)."""
    for path in sorted((run_dir / "checkpoints").glob("step_*[0-9]"), reverse=True):
        if verify(path) is None:
            return path
    raise FileNotFoundError(f"no complete checkpoint under {run_dir / 'checkpoints'}")


def settled_budgets(run_dir: Path) -> list[int]:
    """The controller's schedule (pages per bin) in the run's newest complete checkpoint."""
    state = torch.load(newest_checkpoint(run_dir) / "trainer_state.pt", weights_only=False)
    if state.get("controller") is None:
        raise ValueError(f"{run_dir} has no controller state (schedule.mode=dense?)")
    return list(state["controller"]["budgets_pages"])


def offline_tail(
    cfg: SparrowConfig,
    run_dir: Path,
    budgets_pages: list[int],
    num_prompts: int = 16,
    samples: int = 2,
) -> dict:
    """Per sampling policy ("base": phi = 0, "adapter"), per scoring policy, the exact acceptance
    per bin of `num_prompts` held-out prompts x `samples` under `budgets_pages` (JSON-ready)."""
    if not cfg.distill.enabled or not cfg.distill.gate:
        raise ValueError("offline_tail needs a run with distill.enabled and distill.gate")
    engine, adapter, tokenizer = _engine_and_adapter(cfg, run_dir)
    sched, page_size = cfg.schedule, cfg.rollout.engine.page_size
    schedule = BudgetSchedule(sched.bin_tokens, tuple(budgets_pages), tuple(sched.grid_pages))
    engine.set_schedule(schedule.budget_pages)
    data = load_eval_prompts(cfg.data, cfg.rl.eval.split, tokenizer)
    prompts = [p.token_ids for p in data.prompts[:num_prompts]]
    params = SamplingParams(
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        max_tokens=cfg.rollout.max_new_tokens,
        ignore_eos=cfg.rollout.ignore_eos,
        return_logits=True,
    )
    temperature = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
    result = {
        "budgets_pages": list(budgets_pages),
        "bin_tokens": sched.bin_tokens,
        "num_prompts": len(prompts),
        "samples": samples,
    }
    for sampled_by in ("base", "adapter"):
        values, where, sparse_tokens = _sample_and_score(
            engine, adapter, sampled_by, prompts, params, samples, temperature, page_size
        )
        result[f"sampled_by_{sampled_by}"] = {
            "tokens": len(where),
            "sparse_tokens": sparse_tokens,
            **{
                f"scored_{policy}": [
                    asdict(s) for s in bin_acceptance(torch.cat(v), where, sched.bin_tokens)
                ]
                for policy, v in values.items()
            },
        }
    return result


def _engine_and_adapter(cfg: SparrowConfig, run_dir: Path):
    """(engine over the run's exported theta, the trained adapter's LoRA factors, tokenizer)."""
    policy_dir = run_dir / "policy"
    if not policy_dir.is_dir():
        raise FileNotFoundError(f"{policy_dir} is missing: the run has not finished")
    lm = load_model(replace(cfg.model, name=str(policy_dir)))
    state = torch.load(newest_checkpoint(run_dir) / "trainer_state.pt", weights_only=False)
    engine = LLMEngine(lm.model, lm.tokenizer, cfg.rollout.engine)
    distill = DistillSparse(cfg.distill, lm.model, engine.sparse_settings, cfg.actor.lr)
    distill.load_state_dict(state["distill"])
    adapter = distill.lora_factors()
    del distill  # its copy of the model is no longer needed
    return engine, adapter, lm.tokenizer


def _sample_and_score(
    engine: LLMEngine,
    adapter,
    sampled_by: str,
    prompts: list,
    params: SamplingParams,
    samples: int,
    temperature: float,
    page_size: int,
) -> tuple[dict[str, list[torch.Tensor]], torch.Tensor, int]:
    """Sample `prompts` x `samples` by one sparse policy ("base" or "adapter") and score every
    token both ways against the dense policy. Returns (per scoring policy the acceptance of each
    sample (C,), every sampled token's position (N,), how many were decoded sparsely)."""
    values: dict[str, list[torch.Tensor]] = {"base": [], "adapter": []}
    positions, sparse_tokens = [], 0
    for start in range(0, len(prompts), PROMPTS_PER_CALL):
        chunk = prompts[start : start + PROMPTS_PER_CALL]
        engine.set_lora(adapter if sampled_by == "adapter" else None)
        outs = engine.generate(chunk, params, n=samples)
        other = "base" if sampled_by == "adapter" else "adapter"
        engine.set_lora(adapter if other == "adapter" else None)
        rows_p, rows_c = [o.prompt_ids for o in outs], [o.token_ids for o in outs]
        # One replay: the dense rows (dense decode: theta, the adapter shut) and the other
        # sparse policy's rows, on the same tokens.
        dense_rows: list[Schedule | None] = [None] * len(outs)
        replay = engine.score(
            rows_p + rows_p, rows_c + rows_c, dense_rows + [engine.schedule] * len(outs)
        )
        for i, out in enumerate(outs):
            dense = F.log_softmax(replay[i].float() / temperature, -1)  # (C, V)
            assert out.logits is not None, "generate keeps the logits the score reads"
            own = F.log_softmax(out.logits.float() / temperature, -1)
            theirs = F.log_softmax(replay[len(outs) + i].float() / temperature, -1)
            values[sampled_by].append(exact_acceptance(dense, own))
            values[other].append(exact_acceptance(dense, theirs))
            where = len(out.prompt_ids) + torch.arange(len(out.token_ids))  # (C,)
            positions.append(where)
            sparse_tokens += int((out.budget_pages < dense_pages(where, page_size)).sum())
        del outs, replay
    return values, torch.cat(positions), sparse_tokens
