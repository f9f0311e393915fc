"""The trainer's parts, built from configs: first what sizes the run (`prepare_run`: the seeds,
the model, the prompts and the memory fit, which returns the config the run uses), then each
component from that config. GRPOTrainer only wires what these return.
"""

import os
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sparrow.distill.distill_sparse import DistillSparse
from sparrow.distributed import Ranks
from sparrow.models.loading import load_model
from sparrow.models.shape import ModelShape
from sparrow.monitor.monitor import Monitor
from sparrow.rl.reference import AdapterOffReference, ReferencePolicy
from sparrow.rollout.engine import LLMEngine, SamplingParams
from sparrow.tasks.data import PromptDataset
from sparrow.train.config import RolloutConfig, SparrowConfig
from sparrow.train.memory.fit import Fitted
from sparrow.train.memory.run_inputs import load_run_inputs
from sparrow.train.run.seeds import RunSeeds, resolve_seeds, seed_global_rngs


@dataclass
class PreparedRun:
    """What a run is sized from, ready before any large allocation."""

    cfg: SparrowConfig  # as the memory fit sized it: the config the whole run uses
    model: PreTrainedModel  # the loaded policy, on this rank's device
    tokenizer: PreTrainedTokenizerBase
    shape: ModelShape
    seeds: RunSeeds
    train_data: PromptDataset
    eval_data: PromptDataset
    memory: Fitted  # the plan and what it sized (its line is printed with the run's plan)


def prepare_run(cfg: SparrowConfig, pinned: frozenset[str] = frozenset()) -> PreparedRun:
    """Seeds, model, prompts, then the memory plan they size (`pinned`: keys the user set, which
    the fit leaves as set). Every random stream comes from the one `seed` (run/seeds.py); each
    rank samples its own stream, or row i of every rank would draw the same random numbers (the
    launcher's RANK: the process group is not up yet)."""
    rank = int(os.environ.get("RANK", "0"))
    eng = cfg.rollout.engine
    seeds = resolve_seeds(cfg.seed, eng.seed, cfg.data.shuffle, cfg.data.shuffle_seed, rank)
    seed_global_rngs(seeds.global_rngs)
    loaded = load_model(cfg.model)
    shape = ModelShape.from_hf_config(loaded.model.config)
    on_gpu = torch.cuda.is_available()
    train, held_out, memory = load_run_inputs(
        cfg, loaded.tokenizer, loaded.model.config, shape, on_gpu, pinned
    )
    if on_gpu:  # engine, DistillSparse and actor all live on this rank's GPU
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        # transformers wraps PreTrainedModel.to with functools.wraps, whose stub binds no self.
        loaded.model.to(device)  # type: ignore[arg-type]
    return PreparedRun(
        memory.cfg, loaded.model, loaded.tokenizer, shape, seeds, train, held_out, memory
    )


def build_engine(run: PreparedRun) -> LLMEngine:
    """The rollout engine; it copies the weights it needs (synced from the actor after every
    update) and samples from the run's sampling stream."""
    engine_cfg = replace(run.cfg.rollout.engine, seed=run.seeds.sampling)
    return LLMEngine(run.model, run.tokenizer, engine_cfg, speculative=run.cfg.rollout.speculative)


def build_distill(run: PreparedRun, engine: LLMEngine) -> DistillSparse | None:
    """DistillSparse's adapter when enabled (and the run is sparse). Built before the actor: it
    copies the base weights before ZeRO-3 can partition them in place."""
    cfg = run.cfg
    if not cfg.distill.enabled or cfg.schedule.mode == "dense":
        return None
    return DistillSparse(
        cfg.distill,
        run.model,
        engine.sparse_settings,
        cfg.actor.lr,
        init_seed=run.seeds.distill_init,
        dropout_seed=run.seeds.distill_dropout,
    )


def build_actor(run: PreparedRun, make_actor) -> tuple:
    """The dense policy's trainer and the KL term's reference (None without a KL term): the
    initial weights, copied before ZeRO-3 partitions the actor's in place, then held as the actor
    holds its own. `make_actor(model, cfg.actor)`: DenseActor (DeepSpeed, imported only then)
    unless a test passes a plain-torch one with the same interface."""
    if make_actor is None:
        from sparrow.rl.actor import DenseActor

        make_actor = DenseActor
    reference = None
    lora = run.cfg.actor.lora.rank > 0  # the reference is the actor's base, adapter off
    if run.cfg.rl.loss.kl_coef != 0 and not lora:
        reference = ReferencePolicy(run.model, run.cfg.actor)
    actor = make_actor(run.model, run.cfg.actor)
    if run.cfg.rl.loss.kl_coef != 0 and lora:
        return actor, AdapterOffReference(actor, run.cfg.actor)
    return actor, reference and reference.place(actor)


def check_prompt_split(prompts_per_step: int, world: int) -> None:
    if prompts_per_step % world:
        raise ValueError(f"rl.prompts_per_step={prompts_per_step} must divide over {world} ranks")


def rollout_sampling(cfg: RolloutConfig) -> SamplingParams:
    """The training rollouts' sampling (evaluation has its own, rl.eval)."""
    return SamplingParams(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        max_tokens=cfg.max_new_tokens,
        ignore_eos=cfg.ignore_eos,
    )


def build_monitor(
    run: PreparedRun, engine: LLMEngine, actor, ranks: Ranks, sampling: SamplingParams
) -> Monitor:
    cfg = run.cfg
    return Monitor(
        cfg.monitor,
        cfg.schedule.bin_tokens,  # the monitor bins as the schedule does
        engine,
        actor.model,
        ranks,
        sampling,
        cfg.rl.group_size,
        cfg.actor,
        run.seeds.speedup,
    )
