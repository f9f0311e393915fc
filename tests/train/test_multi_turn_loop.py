"""The GRPO loop on multi-turn episodes (env.function) with the plain-torch FakeActor: what the
actor trains on is, token for token, what the engine sampled plus the observations; observation
tokens have mask 0 and stay out of the loss; the update's one-shot dense log-probs of the model
tokens equal the (dense) rollout's; the step logs turns, tool calls, observation and model
tokens. And `sparrow-train preset=tiny env=calculator rl.steps=2` on the CPU."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fake_actor import FakeActor
from hang_guard import HANG_GUARD_S

from sparrow.cli.config_loader import load_config
from sparrow.train.trainer import GRPOTrainer

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = ROOT / "tests" / "data" / "scripted_env.py"
OVERRIDES = [
    "preset=tiny",
    "rl.eval.every=0",
    "rl.steps=2",
    "rl.prompts_per_step=2",
    "rl.group_size=4",
    "rollout.max_new_tokens=12",
    "rollout.engine.page_size=4",
    f"env.function={SCRIPTED}:make_env",
    "env.max_turns=3",
    "actor.lr=1e-3",
]


def multi_turn_trainer(run_dir, *extra: str):
    """The trainer, its turns closed by every other token id (a random model rarely samples
    <|im_end|>), and what each step's draw returned and each update trained on."""
    cfg = load_config([*OVERRIDES, *extra, f"run_dir={run_dir}"])
    trainer = GRPOTrainer.from_config(cfg, make_actor=FakeActor)
    stops = tuple(range(0, len(trainer.tokenizer), 2))
    trainer.draw.sampling = replace(trainer.draw.sampling, stop_token_ids=stops)
    drawn, trained = [], []
    generate = trainer.draw.episodes.generate
    trainer.draw.episodes.generate = lambda *a, **k: drawn.append(generate(*a, **k)) or drawn[-1]
    real_train_step = trainer.actor.train_step

    def recording_train_step(micro_batches, loss_fn, temperature, keep=None):
        out = real_train_step(micro_batches, loss_fn, temperature, keep=keep)
        for mb, part in zip(micro_batches, keep.parts, strict=True):
            mb["old_logprobs"] = part[0]  # the update's own one-shot dense forward
        trained.append((micro_batches, out))
        return out

    trainer.actor.train_step = recording_train_step
    return trainer, drawn, trained


def rows_of(micro_batches, key):
    return [row for mb in micro_batches for row in mb[key]]


def test_the_actor_trains_exactly_the_sampled_episodes_with_observations_masked(tmp_path):
    trainer, drawn, trained = multi_turn_trainer(tmp_path, "schedule.mode=dense")
    trainer.fit()
    assert len(drawn) == len(trained) == 2
    for outputs, (micro_batches, out) in zip(drawn, trained, strict=True):
        ids, masks = rows_of(micro_batches, "input_ids"), rows_of(micro_batches, "completion_mask")
        attention = rows_of(micro_batches, "attention_mask")
        old, rollout = (
            rows_of(micro_batches, "old_logprobs"),
            rows_of(micro_batches, "rollout_logprobs"),
        )
        assert len(ids) == len(outputs)
        for o, row, mask, att, dense, sparse in zip(
            outputs, ids, masks, attention, old, rollout, strict=True
        ):
            p, n = len(o.prompt_ids), len(o.token_ids)
            # The row is the sampled turns and the observations between them, nothing re-rendered.
            assert row[att].tolist() == o.prompt_ids + o.token_ids
            model = ~o.observation_mask
            assert (
                torch.equal(mask[p : p + n], model)
                and not mask[:p].any()
                and not mask[p + n :].any()
            )
            # The rollout's records reach the update as sampled, 0 on the observations.
            assert torch.equal(sparse[p : p + n][model], o.logprobs[model])
            assert not sparse[p : p + n][~model].any()
            # The update's one-shot dense log-probs of the model tokens are the dense rollout's.
            torch.testing.assert_close(
                dense[p : p + n][model], o.logprobs[model], atol=2e-4, rtol=0
            )
        # The loss counts model tokens only: its hand-computed value over the mask is the logged.
        num = sum(
            float(
                (
                    -mb["advantages"]
                    * torch.exp(mb["old_logprobs"] - mb["rollout_logprobs"]).clamp(max=2.0)
                )[mb["completion_mask"]].sum()
            )
            for mb in micro_batches
        )
        model_tokens = sum(int((~o.observation_mask).sum()) for o in outputs)
        assert sum(int(mb["completion_mask"].sum()) for mb in micro_batches) == model_tokens
        assert out["loss"] == pytest.approx(num / model_tokens, rel=1e-5, abs=1e-7)
    episodes = [o.episode for outs in drawn for o in outs]
    assert max(e.turns for e in episodes) == 3 and sum(e.observation_tokens for e in episodes) > 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for row, outputs in zip(rows, drawn, strict=True):
        turns = sum(o.episode.turns for o in outputs) / len(outputs)
        assert row["episode/turns_mean"] == pytest.approx(turns)
        obs = sum(o.episode.observation_tokens for o in outputs) / len(outputs)
        assert row["episode/observation_tokens_mean"] == pytest.approx(obs)
        assert row["episode/model_tokens_mean"] == pytest.approx(row["len/completion_mean"])
        assert row["episode/tool_calls"] == sum(o.episode.tool_calls for o in outputs)
        # The guard's counts of this draw's environments: one per episode, one step per turn.
        assert row["env/episodes"] == len(outputs)
        assert row["env/steps"] == sum(o.episode.turns for o in outputs)
        assert row["env/errors"] == row["env/timeouts"] == 0.0


def test_sparrow_train_tiny_calculator_runs_on_cpu_and_sparrow_eval_scores_episodes(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}
    cmd = ["preset=tiny", "env=calculator", "rl.steps=2", f"run_dir={tmp_path}"]
    done = subprocess.run(
        [sys.executable, "-m", "sparrow.cli.train", *cmd],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and all(
        " turns " in line and " tok obs/model " in line for line in lines
    )
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "episode/turns_mean" in r]
    assert len(steps) == 2
    for key in ("tool_calls", "tool_errors", "observation_tokens_mean", "model_tokens_mean"):
        assert all(isinstance(r[f"episode/{key}"], float) for r in steps), key
    evaluated = subprocess.run(
        [sys.executable, "-m", "sparrow.cli.eval_policy", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "episodes of env.function=calculator" in evaluated.stderr
    assert evaluated.stdout.startswith("accuracy ")


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dynamic_sampling_draws_rounds_of_episodes(tmp_path):
    trainer, drawn, trained = multi_turn_trainer(
        tmp_path, "rl.dynamic_sampling.enabled=true", "rl.dynamic_sampling.max_rounds=3"
    )
    trainer.fit()
    rows = _rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert len(drawn) == sum(r["sampling/rounds"] for r in rows)  # one episode call per round
    for micro_batches, _ in trained:  # whatever rounds a step kept, observations stay masked
        for mb in micro_batches:
            mask = mb["completion_mask"]
            assert int(mask.sum()) < int(mb["attention_mask"].sum() - mb["prompt_lens"].sum())
    assert all(r["episode/turns_mean"] > 1 for r in rows)
    # Every round's environments are counted, not only the kept rounds'.
    assert [r["env/episodes"] for r in rows] == [8.0 * r["sampling/rounds"] for r in rows]


def test_async_staleness_one_runs_episodes_in_the_producer_thread(tmp_path):
    trainer, drawn, trained = multi_turn_trainer(tmp_path, "rl.async.staleness=1")
    trainer.fit()
    rows = _rows(tmp_path)
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0]
    assert all(r["episode/turns_mean"] > 1 for r in rows)
    for outputs, (micro_batches, _) in zip(drawn, trained, strict=True):
        masks = rows_of(micro_batches, "completion_mask")
        for o, mask in zip(outputs, masks, strict=True):
            p, n = len(o.prompt_ids), len(o.token_ids)
            assert torch.equal(mask[p : p + n], ~o.observation_mask)


def test_kv_read_ratio_is_logged_per_assistant_turn(tmp_path):
    """kv_read_ratio/turn<k>: the pages turn k's decode steps read over a dense decode's, from
    the episodes themselves (turn k follows k - 1 observations); the turns reached, no more."""
    trainer, drawn, _ = multi_turn_trainer(tmp_path)
    trainer.fit()
    page = trainer.cfg.rollout.engine.page_size
    for row, outputs in zip(_rows(tmp_path), drawn, strict=True):
        read, dense = {}, {}
        for o in outputs:
            turn, p = 1, len(o.prompt_ids)
            for i, observed in enumerate(o.observation_mask.tolist()):
                if observed:
                    turn += i > 0 and not o.observation_mask[i - 1]
                    continue
                read[turn] = read.get(turn, 0) + int(o.budget_pages[i])
                dense[turn] = dense.get(turn, 0) + -(-(p + i) // page)
        assert sorted(dense) == [1, 2, 3]  # env.max_turns=3, every turn reached
        per_turn = {k: v for k, v in row.items() if k.startswith("kv_read_ratio/turn")}
        assert per_turn == {f"kv_read_ratio/turn{t}": read[t] / dense[t] for t in dense}
        assert min(per_turn.values()) < 1.0  # the schedule's budgets read less than dense


def test_the_environments_worker_ends_with_the_run(tmp_path):
    """env.isolate=true: the episodes ran in the worker, and fit's end closes it (it would
    otherwise live on beside an in-process caller until the interpreter exits)."""
    trainer, _, _ = multi_turn_trainer(tmp_path, "env.isolate=true", "rl.steps=1")
    factory = trainer.draw.episodes.factory
    assert factory.isolate and factory.sandbox is not None
    worker = factory.sandbox._worker.process
    trainer.fit()
    assert _rows(tmp_path)[-1]["env/episodes"] == 8.0  # the worker's episodes, counted here
    assert worker.poll() is not None, "the environments' worker outlived the run"
