"""Test-only fault point: run the real sparrow-train and freeze in one phase of one step.

    python tests/train/pause_at.py PHASE STEP MARKER_FILE [sparrow-train overrides ...]

PHASE (inside training step STEP unless said otherwise; `none` never pauses):
    load        start-up: the model is loaded, the engine and DeepSpeed are not built yet (STEP
                is ignored)
    eval        the first decode steps of the evaluation after step STEP are done (0: the
                step-0 evaluation, still start-up)
    rollout     after the third decode step of the step's first engine.generate call
    round       after the third decode step of the step's second engine.generate call (with
                rl.dynamic_sampling: mid-way through the step's second round of prompts)
    update      inside actor.train_step, after the first micro-batch's backward pass and before
                the second micro-batch's loss (gradients half accumulated, no optimizer step yet)
    overlap     rl.async.staleness=1: `update` of step STEP while the producer's thread is in
                the third decode step of step STEP+1's rollout (both threads frozen there: the
                kill lands with a rollout in flight); with cluster.rollout_ranks the producer is
                the rollout rank, frozen in that decode step, which writes its pid to MARKER_FILE
                with the suffix `.draw` before the training rank's update pauses
    draw        cluster.rollout_ranks: on a rollout rank, after the third decode step of its
                draw of step STEP
    checkpoint  the actor's DeepSpeed files are written into step_XXXXXX.tmp, no COMPLETE marker
    rename      the COMPLETE marker is written, the .tmp directory is not yet renamed
    export      the final policy export has written the model's weights, not yet its tokenizer
                (STEP is ignored)

On reaching the phase the process writes MARKER_FILE and sleeps, so that a test can SIGKILL it
exactly there instead of racing a timer. With PAUSE_AT_RANK=R in the environment only rank R (of
the whole torchrun world, rollout ranks included) pauses (the others go on until they wait for
it); a MARKER_FILE that exists already (left by the run a relaunch resumes) is not paused at
again. With PAUSE_AT_GO=1 in the environment it sleeps only until MARKER_FILE with the suffix
`.go` appears, then carries on: a test sends a signal while the process is frozen in the phase
and then lets it handle the signal.

The reward `test_length` (registered here, chosen with rl.reward.name=test_length) scores a
completion by its length, so that a random tiny model gets non-zero advantages and its weights
really move, which makes "the same final weights" a real comparison. `test_half_signal` does the
same for about half of the prompts (by a hash of the prompt) and scores the others 0, so that
dynamic sampling needs more than one round per step.

With PAUSE_AT_STOP_EVERY=K in the environment every K-th token id also closes a rollout's
assistant turn (a random tiny model rarely samples its end token), so that multi-turn episodes
(env.function) reach their later turns in a real run; on every rank that draws.

The hooks wrap methods from the outside and call the originals unchanged, so a run that never
reaches its phase is bit-identical to a plain one; the library knows nothing about them.
"""

import dataclasses
import json
import os
import sys
import threading
import time
import zlib
from pathlib import Path

import sparrow.train.build
import sparrow.train.evaluation
import sparrow.train.trainer
from sparrow.cli.train import main
from sparrow.rl.actor import DenseActor
from sparrow.rollout.engine import LLMEngine
from sparrow.rollout.model_runner import ModelRunner
from sparrow.tasks.rewards import RewardResult, register_reward
from sparrow.train.rollouts.draw import RolloutDraw
from sparrow.train.trainer import GRPOTrainer

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/, for hang_guard
from hang_guard import CHILD_GUARD_S  # noqa: E402

PHASES = (
    "none",
    "load",
    "eval",
    "rollout",
    "round",
    "update",
    "overlap",
    "draw",
    "checkpoint",
    "rename",
    "export",
)


class _Run:
    step = 0  # the training step in flight (1-based, as logged)
    generates = 0  # engine.generate calls in the step so far
    decodes_in_rollout: int | None = None  # decode calls since the generate that pauses
    producer_decodes = 0  # decode calls of the producer's thread in the rollout `overlap` waits on
    producer_mid = threading.Event()  # set when that thread is frozen mid-rollout
    remote_overlap = False  # a rollout rank's draw that `overlap` freezes mid-rollout


def _pause(phase: str, step: int, marker: Path) -> None:
    rank = os.environ.get("PAUSE_AT_RANK")
    # With rollout ranks RANK is the rank within the role; the world's is kept beside it.
    world_rank = os.environ.get("SPARROW_WORLD_RANK", os.environ.get("RANK", "0"))
    if marker.exists() or (rank is not None and rank != world_rank):
        return
    tmp = marker.with_suffix(".part")
    tmp.write_text(json.dumps({"phase": phase, "step": step, "pid": os.getpid()}))
    os.replace(tmp, marker)
    go = marker.with_suffix(".go") if os.environ.get("PAUSE_AT_GO") == "1" else None
    while go is None or not go.exists():  # until SIGKILLed, or told to go on
        time.sleep(0.1)


def _length_reward(prompt: str, completion: str, reference: str) -> RewardResult:
    return RewardResult(len(completion) / 64.0)


def _half_signal_reward(prompt: str, completion: str, reference: str) -> RewardResult:
    return RewardResult(len(completion) / 64.0 if zlib.crc32(prompt.encode()) % 2 else 0.0)


def close_turns_every(k: int) -> None:
    """Every k-th token id closes a training rollout's turn (PAUSE_AT_STOP_EVERY)."""
    real_init = RolloutDraw.__init__

    def init(self, cfg, engine, plan, prompts, tokenizer, *args, **kwargs):
        real_init(self, cfg, engine, plan, prompts, tokenizer, *args, **kwargs)
        stops = tuple(range(0, len(tokenizer), k))
        self.sampling = dataclasses.replace(self.sampling, stop_token_ids=stops)

    RolloutDraw.__init__ = init


def install(phase: str, target: int, marker: Path) -> None:
    """Wrap the methods that mark PHASE so that step TARGET freezes there."""
    real_train_step = GRPOTrainer.train_step
    real_generate = LLMEngine.generate
    real_decode = ModelRunner.decode
    real_actor_step = DenseActor.train_step
    real_save = DenseActor.save_checkpoint
    real_replace = os.replace
    real_load_model = sparrow.train.build.load_model
    real_evaluate = sparrow.train.evaluation.evaluate
    real_export = DenseActor.export_hf
    real_drawn_from = RolloutDraw.drawn_from
    remote_draw_frozen = marker.with_suffix(".draw")  # `overlap` with rollout ranks

    def drawn_from(self, step, request, version):  # a rollout rank's draw of 0-based `step`
        if phase == "draw" and step + 1 == target:
            _Run.decodes_in_rollout = 0  # the decode hook pauses at its third call
        if phase == "overlap" and step == target and not marker.exists():
            _Run.producer_decodes = 0  # the decode hook freezes at its third call
            _Run.remote_overlap = True
        try:
            return real_drawn_from(self, step, request, version)
        finally:
            _Run.decodes_in_rollout, _Run.remote_overlap = None, False

    def load_model(*args, **kwargs):
        loaded = real_load_model(*args, **kwargs)
        if phase == "load":
            _pause(phase, target, marker)
        return loaded

    def evaluate(*args, **kwargs):
        if phase == "eval" and _Run.step == target and _Run.decodes_in_rollout is None:
            _Run.decodes_in_rollout = 0  # the decode hook pauses at its third call
        return real_evaluate(*args, **kwargs)

    def export_hf(self, directory, tokenizer=None):
        real_export(self, directory, None)  # the weights
        if phase == "export":
            _pause(phase, target, marker)
        real_export(self, directory, tokenizer)

    def train_step(self):
        _Run.step = self.step + 1
        _Run.generates = 0
        _Run.decodes_in_rollout = None
        return real_train_step(self)

    def generate(self, *args, **kwargs):
        _Run.generates += 1
        pausing = {"rollout": 1, "round": 2}.get(phase) == _Run.generates
        if pausing and _Run.step == target:
            _Run.decodes_in_rollout = 0
        return real_generate(self, *args, **kwargs)

    def decode(self, *args, **kwargs):
        logits = real_decode(self, *args, **kwargs)
        # The asynchronous producer names its thread rollout-<0-based step>: step target + 1.
        if _Run.remote_overlap:
            _Run.producer_decodes += 1
            if _Run.producer_decodes == 3:
                remote_draw_frozen.write_text(str(os.getpid()))
                while True:  # frozen mid-draw until the test kills the whole launch
                    time.sleep(0.1)
        if phase == "overlap" and threading.current_thread().name == f"rollout-{target}":
            _Run.producer_decodes += 1
            if _Run.producer_decodes == 3:
                _Run.producer_mid.set()
                while True:  # frozen mid-rollout until the update's pause is SIGKILLed
                    time.sleep(0.1)
        if _Run.decodes_in_rollout is not None:
            _Run.decodes_in_rollout += 1
            if _Run.decodes_in_rollout == 3:
                _pause(phase, target, marker)
        return logits

    def actor_step(self, micro_batches, loss_fn, *args, **kwargs):
        if phase not in ("update", "overlap") or _Run.step != target:
            return real_actor_step(self, micro_batches, loss_fn, *args, **kwargs)
        if len(micro_batches) < 2:
            raise SystemExit("pause_at update needs at least two micro-batches")
        calls = []

        def paused_loss(*loss_args):
            calls.append(1)
            if len(calls) == 2:
                deadline = time.monotonic() + CHILD_GUARD_S
                while phase == "overlap" and not (
                    _Run.producer_mid.is_set() or remote_draw_frozen.exists()
                ):
                    if time.monotonic() > deadline:
                        raise SystemExit("pause_at overlap: no rollout of the next step in flight")
                    time.sleep(0.05)
                _pause(phase, target, marker)
            return loss_fn(*loss_args)

        return real_actor_step(self, micro_batches, paused_loss, *args, **kwargs)

    def save_checkpoint(self, directory):
        real_save(self, directory)
        if phase == "checkpoint" and _Run.step == target:
            _pause(phase, target, marker)

    def replace(src, dst, *args, **kwargs):
        if phase == "rename" and Path(src).name == f"step_{target:06d}.tmp":
            _pause(phase, target, marker)
        return real_replace(src, dst, *args, **kwargs)

    GRPOTrainer.train_step = train_step
    sparrow.train.build.load_model = load_model  # the run is loaded in build.prepare_run
    sparrow.train.trainer.evaluate = evaluate
    DenseActor.export_hf = export_hf
    LLMEngine.generate = generate
    ModelRunner.decode = decode
    DenseActor.train_step = actor_step
    DenseActor.save_checkpoint = save_checkpoint
    os.replace = replace
    RolloutDraw.drawn_from = drawn_from


if __name__ == "__main__":
    phase, step, marker, *overrides = sys.argv[1:]
    if phase not in PHASES:
        raise SystemExit(f"unknown phase {phase!r}: expected one of {PHASES}")
    register_reward("test_length", lambda cfg: _length_reward)
    register_reward("test_half_signal", lambda cfg: _half_signal_reward)
    install(phase, int(step), Path(marker))
    if os.environ.get("PAUSE_AT_STOP_EVERY"):
        close_turns_every(int(os.environ["PAUSE_AT_STOP_EVERY"]))
    sys.exit(main(overrides))
