"""What one step reports: rollout metrics from the batch, the console lines per step and per
evaluation, and the one warning when the reward starts failing (in training, and in
evaluations)."""

import logging
import math

import torch

from sparrow.control.controller import resolve_objective
from sparrow.distributed import Ranks
from sparrow.models.shape import ModelShape
from sparrow.rl.actor_memory import micro_batch_activation_bytes
from sparrow.rl.batch import RolloutBatch
from sparrow.tasks.rewards import BatchScores, GuardedReward
from sparrow.train.config import SparrowConfig
from sparrow.train.memory.plan import actor_micro_batch_tokens
from sparrow.train.rollouts.episodes import episode_metrics

log = logging.getLogger(__name__)


def rollout_metrics(batch: RolloutBatch, scores: BatchScores, outputs, ranks: Ranks) -> dict:
    """Reward, accuracy, lengths and finish reasons over all ranks' samples (means, and the
    longest completion of any rank); `rollout/tokens` is the mean over ranks."""
    n = len(outputs)
    lengths = batch.completion_mask.sum(1).float()  # (B,)
    truncated = sum(o.finish_reason == "length" for o in outputs)
    return {
        "reward/mean": ranks.mean(float(scores.scores.sum()), n),
        "acc/train": ranks.mean(float((scores.scores >= 1.0).sum()), n),
        "len/completion_mean": ranks.mean(float(lengths.sum()), n),
        "len/completion_max": ranks.extreme([float(lengths.max())], "max"),
        "len/prompt_mean": ranks.mean(float(batch.prompt_lens.sum()), n),
        "len/truncated_frac": ranks.mean(float(truncated), n),
        "rollout/tokens": ranks.mean(float(lengths.sum()), 1),
    } | episode_metrics(outputs, ranks)


class RewardFailures:
    """A reward that fails (raises, returns a non-finite score or overruns its deadline) scores
    0 and the run goes on, so a reward broken on every completion would train to the end at
    `reward 0.000` unseen: the first step with failures on any rank warns once, on rank 0, with
    the reward's name, the step's count and the last error; every step's line counts them. An
    evaluation's failures score 0 too, which reads as `accuracy 0.000`: the first evaluation
    with failures warns the same way, and every eval line counts them."""

    def __init__(self, reward: GuardedReward, ranks: Ranks):
        self.reward, self.ranks = reward, ranks
        self.warned = False
        self.warned_eval = False

    def check(self, step: int, metrics: dict) -> None:
        """Call on every rank with the step's all-rank metrics (collective the first time)."""
        failed = int(metrics["reward/errors"] + metrics["reward/timeouts"])
        if self.warned or not failed:
            return
        self.warned = True
        where = f"in step {step} (each scored 0)"
        note = " (the step line counts failures as reward_errors)"
        self._warn(failed, int(metrics["reward/calls"]), where, note)

    def check_eval(self, metrics: dict, where: str) -> None:
        """The same for an evaluation's all-rank metrics (`evaluate`'s); `where` ends "failed on
        N of M completions ...", e.g. "in the evaluation at step 0"."""
        failed = int(metrics.get("eval/reward_errors", 0) + metrics.get("eval/reward_timeouts", 0))
        if self.warned_eval or not failed:
            return
        self.warned_eval = True
        where += " (each scored 0, a wrong answer to accuracy)"
        self._warn(failed, int(metrics["eval/reward_calls"]), where, "")

    def _warn(self, failed: int, calls: int, where: str, note: str) -> None:
        # Every rank sees the same sums, so all join this gather once.
        errors = self.ranks.gather_strided([self.reward.stats.last_error])
        # None on every rank: the completions were scored on rollout ranks, which keep theirs.
        last = next((e for e in errors if e), "not sent back by the rollout ranks that scored")
        last = " ".join(last.split())
        if self.ranks.rank == 0:
            log.warning(
                "reward %r failed on %d of %d completions %s; last error: %s%s",
                self.reward.name, failed, calls, where, last[:400], note,
            )  # fmt: skip


def throughput_metrics(tokens_per_rank: float, world: int, times: dict) -> dict:
    """Generated tokens per second of all ranks, over the rollout phase and over the whole step."""
    tokens = tokens_per_rank * world
    return {
        f"throughput/{phase}_tok_s": tokens / max(times[f"time/{phase}_s"], 1e-9)
        for phase in ("rollout", "step")
    }


def format_step_line(step: int, total: int, m: dict) -> str:
    """reward, accuracy, lengths, the reward's failures (when any), loss, clip fractions,
    rollout-correction weights (mean [min, max], and the truncated / masked token shares), p5,
    KV ratio, time split."""

    def g(key, fmt="{:.3f}"):
        value = m.get(key, math.nan)
        return fmt.format(value) if isinstance(value, (int, float)) else str(value)

    update = (
        f"loss {g('loss/loss', '{:+.4f}')} "
        f"clip lo/hi {g('update/clip_frac_low')}/{g('update/clip_frac_high')} "
        f"corr {g('correction/weight_mean')} [{g('correction/weight_min', '{:.2f}')}, "
        f"{g('correction/weight_max', '{:.2f}')}] trunc "
        f"{g('correction/truncated_frac')} mask {g('correction/masked_frac')}"
    )
    if m.get("update/no_signal"):
        update = "no signal (all advantages 0): update skipped"
    if m.get("update/policy_frozen"):
        update = "policy frozen (rl.update_policy=false)"
    sampling = ""
    if "sampling/groups_kept" in m:  # dynamic sampling
        limit = " (round limit)" if m.get("sampling/round_limit_hit") else ""
        sampling = (
            f" | groups kept {g('sampling/groups_kept', '{:.0f}')}/"
            f"{g('sampling/groups_drawn', '{:.0f}')} in {g('sampling/rounds', '{:.0f}')} "
            f"rounds{limit}"
        )
    # No separate dense pass under rl.dense_pass=update: no log-prob phase to show.
    logp = f"logp {g('time/logprobs_s', '{:.1f}')}s " if "time/logprobs_s" in m else ""
    failed = m.get("reward/errors", 0) + m.get("reward/timeouts", 0)
    failures = f" reward_errors {failed:.0f}/{g('reward/calls', '{:.0f}')}" if failed else ""
    if "episode/turns_mean" in m:  # multi-turn episodes (env.function)
        failures += (
            f" turns {g('episode/turns_mean', '{:.2f}')} tools "
            f"{g('episode/tool_calls', '{:.0f}')} err {g('episode/tool_errors', '{:.0f}')} "
            f"tok obs/model {g('episode/observation_tokens_mean', '{:.0f}')}/"
            f"{g('episode/model_tokens_mean', '{:.0f}')}"
        )
    if "spec/tokens_per_verify" in m:  # speculative rollouts: the drafts' acceptance and yield
        tail = (
            f"spec a {g('spec/accept/mean')} k {g('spec/draft_tokens', '{:.0f}')} "
            f"tok/verify {g('spec/tokens_per_verify', '{:.2f}')}"
        )
    else:
        tail = f"p5 min {g('accept/p5_min')}"
    return (
        f"step {step}/{total} | reward {g('reward/mean')} acc {g('acc/train')} "
        f"len {g('len/completion_mean', '{:.1f}')}{failures}{sampling} | {update} | "
        f"{tail} kv {g('kv_read_ratio', '{:.2f}')} | rollout {g('time/rollout_s', '{:.1f}')}s "
        f"{logp}monitor {g('time/monitor_s', '{:.1f}')}s "
        f"update {g('time/update_s', '{:.1f}')}s"
    )


def format_eval_line(step: int, result: dict) -> str:
    """Accuracy with its 95% CI, mean length, the paired change since the first evaluation, and
    with k samples per prompt pass@j and mean@k with theirs."""
    line = (
        f"eval step {step}: accuracy {result['eval/accuracy']:.3f} "
        f"(95% CI {result['eval/accuracy_lo95']:.3f}-{result['eval/accuracy_hi95']:.3f}, "
        f"n={int(result['eval/n'])}), mean length {result['eval/len_mean']:.1f}"
    )
    if "eval/reward_calls" in result:  # the reward failed: those completions scored 0
        failed = result["eval/reward_errors"] + result["eval/reward_timeouts"]
        line += f", reward_errors {failed:.0f}/{result['eval/reward_calls']:.0f}"
    if "eval/delta" in result:
        line += (
            f"; vs first eval {result['eval/delta']:+.3f} "
            f"(95% CI {result['eval/delta_lo95']:+.3f} to {result['eval/delta_hi95']:+.3f})"
        )
    sampled = [k for k in result if k.startswith(("eval/pass@", "eval/mean@")) and "_" not in k]
    for key in sampled:  # with rl.eval.samples > 1: the k samples' scores, greedy's beside them
        line += (
            f"; {key.removeprefix('eval/')} {result[key]:.3f} "
            f"({result[key + '_lo95']:.3f}-{result[key + '_hi95']:.3f})"
        )
    return line


def format_plan(
    cfg: SparrowConfig,
    data_summary: str,
    world: int,
    model_config=None,
    prompt_lengths: tuple[int, int] | None = None,
    seeds: str | None = None,
) -> str:
    """The run's plan, printed once before the first step; with the HF `model_config`, the
    actor's micro-batch size in tokens and its estimated activation peak; `prompt_lengths` is
    the dataset's (longest prompt, common prefix) in tokens; `seeds`, RunSeeds.describe()."""
    schedule = cfg.schedule
    sched = (
        "dense"
        if schedule.mode == "dense"
        else f"{schedule.mode} (tau {cfg.controller.tau}, bins of {schedule.bin_tokens})"
    )
    rl = cfg.rl
    lines = [
        f"sparrow-train: {cfg.model.name} | {data_summary}",
        f"  {rl.steps} steps x {rl.prompts_per_step} prompts x {rl.group_size} "
        f"samples, {cfg.rollout.max_new_tokens} new tokens max, ranks {world}, "
        f"ZeRO-{cfg.actor.zero_stage}; schedule {sched}; rollout correction "
        f"{_correction(rl.correction)}; run dir {cfg.run_dir}",
    ]
    if rl.dynamic_sampling.enabled:
        lines.append(
            f"  dynamic sampling: rounds of {rl.prompts_per_step} prompts until "
            f"{rl.prompts_per_step} groups have rewards not all equal, at most "
            f"{rl.dynamic_sampling.max_rounds} rounds (sampling/* per step)"
        )
    spec = cfg.rollout.speculative
    if spec.enabled:
        lines.append(
            f"  speculative rollouts: sparse drafts, one dense verify pass, samples the dense "
            f"policy's; {_speculative_control(cfg)}"
        )
    if seeds is not None:
        lines.append(f"  {seeds}")
    if model_config is not None:
        lines.append("  " + actor_plan(cfg, model_config, *(prompt_lengths or ())))
    return "\n".join(lines)


def _speculative_control(cfg: SparrowConfig) -> str:
    """Who sets the budgets and k of speculative rollouts, for the plan line."""
    k = cfg.rollout.speculative.draft_tokens
    if cfg.schedule.mode == "dense":
        return f"{k} drafts per round (schedule dense: the drafts are the dense policy's)"
    if resolve_objective(cfg.controller.objective, True) == "tail":
        return (
            f"{k} drafts per round; controller.objective=tail: the controller holds its budgets "
            "(the rows' acceptance is the noise floor), throughput is not steered"
        )
    budgets = "budgets per bin and " if cfg.schedule.mode == "online" else ""
    return (
        f"controller.objective=throughput: {budgets}k (1-8, from {k}) chosen for the most "
        "expected tokens/s from the drafts' measured acceptance and the cost model"
    )


def _correction(c) -> str:
    if c.mode in ("tis", "seq_tis"):
        return f"{c.mode} (cap {c.cap})"
    if c.mode in ("token_mask", "seq_mask"):
        return f"{c.mode} [{c.lo}, {c.hi}]"
    return c.mode


def actor_plan(
    cfg: SparrowConfig,
    model_config,
    longest_prompt: int | None = None,
    common_prefix: int = 0,
) -> str:
    """Decoder tokens per actor micro-batch (the budget, or micro_batch_size rows at the longest
    prompt and generation, with prompts and their common prefix run once as the actor does) and
    the activation estimate of sparrow.rl.actor_memory at that size.

    `longest_prompt` and `common_prefix` come from the dataset; without them the row is sized at
    data.max_prompt_tokens, which overstates a short-prompt run by the ratio of the two."""
    actor = cfg.actor
    tokens, how = actor_micro_batch_tokens(cfg, longest_prompt, common_prefix)
    bf16 = actor.precision == "bf16" or (actor.precision == "auto" and torch.cuda.is_available())
    peak = micro_batch_activation_bytes(
        ModelShape.from_hf_config(model_config),
        tokens,
        actor.activation_checkpointing,
        actor.logprob_chunk_tokens,
        bytes_per_value=2 if bf16 else 4,
    )
    checkpointing = "on" if actor.activation_checkpointing else "off"
    return (
        f"actor: micro-batches of <= {tokens} tokens ({how}), activation peak est. "
        f"{peak / 2**30:.1f} GiB each (checkpointing {checkpointing})"
    )


def update_metrics(update: dict) -> dict:
    """The actor's, the rollout correction's and DistillSparse's update metrics under their
    dashboard names."""
    named = {"loss": "loss/loss", "pg_loss": "loss/pg_loss"}
    return {
        k if k.startswith(("distill/", "correction/")) else named.get(k, f"update/{k}"): v
        for k, v in update.items()
    }
