"""DistillSparse at a fixed aggressive budget: the sparse policy's tail before vs after training.

SmolLM2-135M-Instruct on the embedded arithmetic task (~45-token chat prompts), sampled at T = 1
with up to 96 new tokens under a fixed budget of a few 16-token pages in every layer but 0 and 1
(one value, or one per position bin: `--budget-pages 3,4,5,6,6`), so that tokens past the budget
are decoded sparsely. The dense weights theta stay fixed (no
GRPO update of theta here): only the adapter phi is trained, on rollouts of the sparse policy
theta + phi over training prompts. Held-out prompts measure, per 32-token position bin, the exact
full-vocabulary acceptance sum_v min(p_dense, q_sparse) of the sampled tokens: dense engine vs the
sparse engine's teacher-forced replay (`LLMEngine.score`), before and after N steps (fresh samples
of the current sparse policy each time, as the monitor sees them; and the after-policy on the
before-samples, a paired comparison). Then the online part: the online controller (tau, from the
grid's smallest budget or `--online-start`) on a frozen theta, once with the base sparse policy
(phi = 0) and once with the trained adapter, which keeps distilling on the controller's rollouts;
the same held-out prompts for both arms (`--online-arms` runs one of them). Reported: the KV-read
ratio per step and its mean, the schedule and p5 per bin. Prints tables and writes JSON.

`--gate` (default): phi acts only at tokens decoded sparsely (budget < pages), in training and in
the engine (theta in its weights, phi as an unmerged LoRA: `LLMEngine.set_lora`), so densely
attended tokens keep the dense policy; `--no-gate`: phi merged into theta, at every token (the
runs written up in docs/distill/ before the gate existed).

    python -m sparrow.experiments.distill_experiment --steps 1 --eval-prompts 2 \
        --prompts-per-step 2 --group-size 2 --max-new-tokens 40 --budget-pages 3 \
        --online-steps 2  # smoke, ~2 min
    python -m sparrow.experiments.distill_experiment --out runs/distill.json  # full, ~30 min

Defaults: pure distillation with the top-K KL (pg_coef 0, lambda_k3 0, lambda_kl 1), which
isolates the tail effect in a CPU-sized run; `--lambda-kl 0 --lambda-k3 1` is the k3-only run
written up first in docs/distill/, `--pg-coef 1 --lambda-k3 1e-3 --lambda-kl 0` the paper's loss
mix. At lr 1e-3 the first k3 update on SmolLM2 overshot (k3 0.34 -> 0.89, gradient norm 43).
"""

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from sparrow.control.acceptance import bin_acceptance, exact_acceptance
from sparrow.control.controller import ControllerConfig, OnlineController
from sparrow.control.kv_read import dense_pages, kv_read_ratio
from sparrow.control.schedule import BudgetSchedule
from sparrow.distill import DistillConfig, DistillSparse
from sparrow.models.loading import ModelConfig, load_model
from sparrow.rl.advantages import AdvantageConfig, broadcast_to_tokens, make_advantage_fn
from sparrow.rl.batch import collate_rollouts
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.tasks.data import DataConfig, PromptIterator, load_prompts
from sparrow.tasks.rewards import RewardConfig, build_reward, score_batch

SCORE_CHUNK = 16  # sequences per engine.score call: bounds the (T, V) logits held at once


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--budget-pages",
        default="4",
        help="the offline part's sparse budget in pages: one value for every position, or a "
        "comma list, one value per --bin-tokens bin (the last one repeats)",
    )
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--steps", type=int, default=20, help="distillation steps")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4, help="samples per training prompt")
    p.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts")
    p.add_argument("--eval-samples", type=int, default=2, help="samples per held-out prompt")
    p.add_argument("--bin-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-4, help="adapter AdamW learning rate")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--pg-coef", type=float, default=0.0)
    p.add_argument("--lambda-k3", type=float, default=0.0)
    p.add_argument("--lambda-kl", type=float, default=1.0, help="top-K KL weight")
    p.add_argument("--topk", type=int, default=20, help="dense top-K for the KL term")
    p.add_argument("--online-steps", type=int, default=12, help="0: skip the online part")
    p.add_argument("--online-prompts", type=int, default=4, help="held-out prompts per step")
    p.add_argument("--online-samples", type=int, default=2)
    p.add_argument("--tau", type=float, default=0.86)
    p.add_argument(
        "--min-tokens", type=int, default=30, help="controller: fewer tokens in a bin, no action"
    )
    p.add_argument(
        "--online-arms",
        default="without,with",
        help="which online arms to run: without and/or with DistillSparse (each is deterministic "
        "for a seed, so arms of separate runs with the same flags compare)",
    )
    p.add_argument("--grid", default="3,4,5,6,8,10", help="online grid (pages, >= sink + recent)")
    p.add_argument(
        "--online-start",
        help="the online controller's first schedule, pages per bin (default: the grid's smallest)",
    )
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--score", default="quest", choices=["quest", "centroid"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--gate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="phi only at sparsely decoded tokens (--no-gate: merged into every token)",
    )
    p.add_argument(
        "--save-adapter", help="write the adapter (and its optimizer) here after training"
    )
    p.add_argument(
        "--load-adapter", help="start from this saved adapter (with --steps 0: online part only)"
    )
    p.add_argument("--out", default="runs/distill_experiment.json")
    return p


def parse_args() -> argparse.Namespace:
    return build_parser().parse_args()


class Experiment:
    def __init__(self, args: argparse.Namespace):
        torch.manual_seed(args.seed)
        self.args = args
        lm = load_model(ModelConfig())
        self.model, self.tokenizer = lm.model, lm.tokenizer
        self.base = {k: v.clone() for k, v in self.model.state_dict().items()}  # theta
        cfg = EngineConfig(
            num_pages=4096, score=args.score, linear_backend="onednn", seed=args.seed
        )
        self.engine = LLMEngine(self.model, self.tokenizer, cfg)
        self.grid = pages_list(args.grid)
        fixed = BudgetSchedule(
            args.bin_tokens, pages_list(args.budget_pages), self.grid, page_size=cfg.page_size
        )
        self.sparse_schedule = fixed.budget_pages
        self.use_adapter = True  # False: the sparse policy is theta alone (phi = 0)
        distill_cfg = DistillConfig(
            enabled=True,
            rank=args.rank,
            alpha=args.alpha,
            lr_factor=1.0,
            lambda_k3=args.lambda_k3,
            lambda_kl=args.lambda_kl,
            pg_coef=args.pg_coef,
            micro_batch_size=args.micro_batch_size,
            gate=args.gate,
        )
        self.distill = DistillSparse(
            distill_cfg, self.model, self.engine.runner.kv.cfg, actor_lr=args.lr
        )
        data = DataConfig()
        self.train = PromptIterator(load_prompts(data, self.tokenizer), args.prompts_per_step)
        heldout = load_prompts(DataConfig(split="heldout"), self.tokenizer)
        self.heldout = heldout.prompts[: args.eval_prompts]
        self.heldout_pool = heldout.prompts[args.eval_prompts :]  # the online part's prompts
        self.reward = build_reward(RewardConfig())
        self.advantages = make_advantage_fn(AdvantageConfig())
        self.params = SamplingParams(temperature=1.0, max_tokens=args.max_new_tokens)

    def load_sparse_policy(self) -> None:
        """The engine as the sparse policy: theta + phi (gated: theta stays in the weights and
        phi is an unmerged LoRA; merged: theta + phi in the weights), or theta alone."""
        if self.args.gate:
            self.engine.set_lora(self.distill.lora_factors() if self.use_adapter else None)
        else:
            merged = self.distill.merged_state_dict() if self.use_adapter else self.base
            self.engine.update_weights(merged)
        self.engine.set_schedule(self.sparse_schedule)

    def load_dense_policy(self) -> None:
        """The engine as theta, dense. A gated adapter is shut at dense steps by itself."""
        if not self.args.gate:
            self.engine.update_weights(self.base)
        self.engine.set_schedule(None)

    def sample_sparse(self, prompts: list[list[int]], n: int):
        self.load_sparse_policy()
        return self.engine.generate(prompts, self.params, n=n)

    def replay(self, prompts: list[list[int]], completions: list[list[int]], sparse: bool):
        """Full-vocabulary log-probs (T_i, V) per sequence: theta + phi sparse, or theta dense."""
        if sparse:
            self.load_sparse_policy()
        else:
            self.load_dense_policy()
        return [torch.log_softmax(x, dim=-1) for x in self.engine.score(prompts, completions)]

    def acceptance(self, prompts, completions) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact acceptance (N,) and absolute positions (N,) of all completion tokens."""
        values = []
        for s in range(0, len(prompts), SCORE_CHUNK):
            chunk = (prompts[s : s + SCORE_CHUNK], completions[s : s + SCORE_CHUNK])
            dense, sparse = self.replay(*chunk, sparse=False), self.replay(*chunk, sparse=True)
            values += [exact_acceptance(d, q) for d, q in zip(dense, sparse, strict=True)]
        positions = [
            len(p) + torch.arange(len(c)) for p, c in zip(prompts, completions, strict=True)
        ]
        return torch.cat(values), torch.cat(positions)

    def evaluate(self) -> dict:
        n = self.args.eval_samples
        outs = self.sample_sparse([p.token_ids for p in self.heldout], n)
        prompts = [o.prompt_ids for o in outs]
        completions = [o.token_ids for o in outs]
        values, positions = self.acceptance(prompts, completions)
        return {
            "prompts": prompts,
            "completions": completions,
            "values": values,
            "positions": positions,
        }

    def train_step(self) -> dict:
        prompts = next(self.train)
        outs = self.sample_sparse([p.token_ids for p in prompts], self.args.group_size)
        return self.distill_on(prompts, outs)

    def distill_on(self, prompts, outs) -> dict:
        """One adapter step on the sparse rollouts `outs` of `prompts`."""
        batch = collate_rollouts([p.token_ids for p in prompts], outs, self.tokenizer.pad_token_id)
        scores = score_batch(
            self.reward,
            [prompts[o.prompt_index].text for o in outs],
            [o.text for o in outs],
            [prompts[o.prompt_index].answer for o in outs],
        )
        advantages = self.advantages(scores.scores, batch.group_ids)  # (B,)
        dense, topk = self.dense_logprobs(batch.input_ids, batch.attention_mask)  # (B, T)
        metrics = self.distill.step(
            batch,
            dense,
            broadcast_to_tokens(advantages, batch.completion_mask),
            1.0,
            dense_topk=topk,
        )
        metrics["reward"] = float(scores.scores.mean())
        metrics["sparse_tokens"] = int(batch.completion_mask.sum())
        return metrics

    @torch.no_grad()
    def dense_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Log-probs of the dense base model theta, aligned as in RolloutBatch: (B, T) of the
        tokens and (ids, log-probs), each (B, T, K), of the top-K per position."""
        k = self.args.topk
        out = torch.zeros(input_ids.shape)
        topk_ids = torch.zeros((*input_ids.shape, k), dtype=torch.long)
        topk_lp = torch.zeros((*input_ids.shape, k))
        for s in range(0, len(input_ids), self.args.micro_batch_size):
            ids = input_ids[s : s + self.args.micro_batch_size]  # (b, T)
            mask = attention_mask[s : s + self.args.micro_batch_size]  # (b, T)
            logits = self.model(input_ids=ids, attention_mask=mask.long()).logits.float()
            logprobs = torch.log_softmax(logits[:, :-1], -1)  # (b, T - 1, V)
            picked = logprobs.gather(-1, ids[:, 1:, None])[..., 0]  # (b, T - 1)
            out[s : s + len(ids), 1:] = picked * mask[:, 1:]
            values, indices = logprobs.topk(k, dim=-1)  # (b, T - 1, K)
            topk_ids[s : s + len(ids), 1:] = indices
            topk_lp[s : s + len(ids), 1:] = values
        return out, (topk_ids, topk_lp)

    def online(self, with_adapter: bool, prompts: list) -> list[dict]:
        """The online controller on frozen theta, from --online-start (default: the grid's
        smallest budget); the adapter (if used) keeps distilling on the controller's rollouts.
        One record per step."""
        args = self.args
        start = pages_list(args.online_start) if args.online_start else self.grid[:1]
        page_size = self.engine.cfg.page_size
        schedule = BudgetSchedule(args.bin_tokens, start, self.grid, page_size=page_size)
        controller = OnlineController(
            schedule, ControllerConfig(tau=args.tau, min_tokens=args.min_tokens)
        )
        self.use_adapter = with_adapter
        self.sparse_schedule = lambda context_tokens: controller.schedule.budget_pages(
            context_tokens
        )
        history = []
        for step in range(args.online_steps):
            batch = prompts[step * args.online_prompts : (step + 1) * args.online_prompts]
            budgets = controller.schedule.budgets_pages
            outs = self.sample_sparse([p.token_ids for p in batch], args.online_samples)
            values, positions = self.acceptance(
                [o.prompt_ids for o in outs], [o.token_ids for o in outs]
            )
            stats = bin_acceptance(values, positions, args.bin_tokens)
            pages_read = sum(int(o.budget_pages.sum()) for o in outs)
            pages_dense = int(dense_pages(positions, page_size).sum())
            controller.update(stats)
            record = {
                "step": step + 1,
                "budgets_pages": list(budgets),
                "kv_read_ratio": kv_read_ratio(pages_read, pages_dense),
                "p5": {s.bin_index: s.p5 for s in stats},
                "tokens": int(len(values)),
            }
            if with_adapter:
                record |= self.distill_on(batch, outs)
            history.append(record)
            print(
                f"online ({'with' if with_adapter else 'without'} DistillSparse) step {step + 1}: "
                f"budgets {list(budgets)} KV {record['kv_read_ratio']:.3f} p5 "
                + " ".join(f"{b}:{v:.2f}" for b, v in record["p5"].items()),
                flush=True,
            )
        return history


def pages_list(text: str) -> tuple[int, ...]:
    """ "3,4,5" -> (3, 4, 5)."""
    return tuple(int(x) for x in text.split(","))


def bins_table(name: str, values: torch.Tensor, positions: torch.Tensor, bin_tokens: int):
    return {
        s.bin_index: asdict(s) | {"condition": name}
        for s in bin_acceptance(values, positions, bin_tokens)
    }


def main() -> None:
    args = parse_args()
    start = time.perf_counter()
    exp = Experiment(args)
    if args.load_adapter:
        exp.distill.load_state_dict(torch.load(args.load_adapter, weights_only=False))
    # --steps 0 with a loaded adapter: the online part only (the offline tables would compare
    # the loaded adapter with itself).
    offline = offline_part(exp, args, start) if args.steps else {}
    online = {}
    if args.online_steps:
        pool = exp.heldout_pool[: args.online_steps * args.online_prompts]
        if len(pool) < args.online_steps * args.online_prompts:
            raise SystemExit(
                f"--online-steps x --online-prompts needs {args.online_steps * args.online_prompts}"
                f" held-out prompts; {len(exp.heldout_pool)} are left after --eval-prompts"
            )
        arms = args.online_arms.split(",")
        if not arms or set(arms) - {"without", "with"}:
            raise SystemExit(f"--online-arms: without and/or with, got {args.online_arms!r}")
        online = {arm: exp.online(arm == "with", pool) for arm in arms}
        for arm, steps in online.items():
            mean = sum(r["kv_read_ratio"] for r in steps) / len(steps)
            late = steps[len(steps) // 2 :]
            late_mean = sum(r["kv_read_ratio"] for r in late) / len(late)
            print(
                f"online {arm} DistillSparse: mean KV-read ratio {mean:.3f} (second half "
                f"{late_mean:.3f}), final budgets {steps[-1]['budgets_pages']}"
            )
    result = {"args": vars(args), **offline, "online": online}
    result["seconds"] = time.perf_counter() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out} ({result['seconds']:.0f} s)")


def offline_part(exp: Experiment, args: argparse.Namespace, start: float) -> dict:
    """Held-out acceptance before, `args.steps` adapter steps, held-out acceptance after (fresh
    samples, and the before-samples replayed: paired)."""
    before = exp.evaluate()
    print(f"before: {len(before['values'])} held-out tokens ({time.perf_counter() - start:.0f} s)")
    history = []
    for step in range(1, args.steps + 1):
        metrics = exp.train_step()
        history.append(metrics)
        print(
            f"step {step}/{args.steps}: k3 {metrics['distill/k3']:.4f} "
            f"logp_gap {metrics['distill/logp_gap']:+.4f} reward {metrics['reward']:.2f} "
            f"grad_norm {metrics['distill/grad_norm']:.3f} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    if args.save_adapter:
        torch.save(exp.distill.state_dict(), args.save_adapter)
    after = exp.evaluate()
    paired_values, paired_positions = exp.acceptance(before["prompts"], before["completions"])
    conditions = {
        "before": bins_table("before", before["values"], before["positions"], args.bin_tokens),
        "after": bins_table("after", after["values"], after["positions"], args.bin_tokens),
        "after_on_before_samples": bins_table(
            "after_on_before_samples", paired_values, paired_positions, args.bin_tokens
        ),
    }
    print_table(conditions)
    return {
        "bins": {k: list(v.values()) for k, v in conditions.items()},
        "overall_mean": {
            "before": float(before["values"].mean()),
            "after": float(after["values"].mean()),
            "after_on_before_samples": float(paired_values.mean()),
        },
        "train": history,
    }


def print_table(conditions: dict[str, dict[int, dict]]) -> None:
    names = list(conditions)
    header = "bin (positions)  " + "  ".join(f"{n:>28}" for n in names)
    print(header + "\n" + " " * 17 + "  ".join(f"{'n / mean / p5':>28}" for _ in names))
    for b in sorted(set().union(*[set(c) for c in conditions.values()])):
        first = next(c[b] for c in conditions.values() if b in c)
        cells = []
        for name in names:
            s = conditions[name].get(b)
            cell = f"{s['count']:5d} / {s['mean']:.3f} / {s['p5']:.3f}" if s else "-"
            cells.append(f"{cell:>28}")
        print(f"{b:3d} [{first['start_token']:4d},{first['end_token']:4d})  " + "  ".join(cells))


if __name__ == "__main__":
    main()
