"""`sparrow-bench actor`: the dense actor's cost on one GRPO batch, in two measurements.

    sparrow-bench actor prefix [--repeats 3] [--tiny]   # share_prefix on vs off: pass times
    sparrow-bench actor memory 8 0 [--checkpointing]    # peak RSS of one update vs the estimate
    sparrow-bench actor long-prompt 2 step              # peak RSS vs the memory plan, 3.2K prompts

`prefix`: the log-prob pass and the update over a few-shot-shaped batch (8 groups x 6 rows,
258-token prompts sharing their first 230 tokens, 25-token completions), the embedded SmolLM2
(or a tiny Qwen3, --tiny), fp32 ZeRO-0 as conf/actor/cpu.yaml; two actors from the same weights,
timed alternately; prints the median seconds off and on and their ratio.
`memory GROUP MAX_TOKENS`: one update over one group of GROUP rows (a 64-token prompt and 1,024
completion tokens each) on a tiny Qwen3 (hidden 256, 4 layers); MAX_TOKENS is the actor's token
budget per micro-batch (0: the group whole). Prints the growth of the process's peak RSS over the
update beside the plan line's activation estimate of its largest micro-batch
(sparrow.rl.actor_memory); one setting per process, as ru_maxrss only grows. On a GPU (the
default device when there is one, `--device`) both run there, and `memory` reports the growth of
CUDA's peak allocation instead.
`long-prompt GROUPS PHASE`: the embedded SmolLM2 (fp32, checkpointing on, one micro-batch),
GROUPS groups of 6 rows sharing 3,200-token prompts, 32 completion tokens; PHASE `logprobs` (the
no-grad pass) or `step` (one update, AdamW's state created in it). Prints the peak RSS growth
(on a GPU: of CUDA's peak allocation) beside the run's memory plan for that phase
(sparrow.train.memory.plan), prompts' K/V indexed out to the rows included; one setting per
process.
"""

import argparse
import json
import resource
import statistics
import time

import torch
from transformers import PreTrainedModel

from sparrow.bench.device import bench_device
from sparrow.cli.errors import ArgumentParser, at_least
from sparrow.models.loading import ModelConfig, load_model, tiny_model_config
from sparrow.models.shape import ModelShape
from sparrow.rl.actor_config import ActorConfig
from sparrow.rl.actor_memory import micro_batch_activation_bytes, micro_batch_decoder_tokens

GROUPS, GROUP_SIZE, PREFIX, PROMPT, COMPLETION = 8, 6, 230, 258, 25
MEMORY_PROMPT, MEMORY_COMPLETION, MEMORY_VOCAB = 64, 1024, 300


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = {"prefix": _prefix, "memory": _memory, "long-prompt": _long_prompt}[args.what]
    result = run(args)
    print(json.dumps(result))
    return 0


def policy_gradient_loss(global_tokens: int):
    """-A * logp over completion tokens, normalised by the step's completion-token count."""

    def loss_fn(new_logprobs, mb):
        mask = mb["completion_mask"].float()  # (b, T)
        loss = -(mb["advantages"][:, None] * new_logprobs * mask).sum() / global_tokens
        return loss, {}

    return loss_fn


def grouped_batch(
    groups: int, group_size: int, prefix: int, prompt: int, completion: int, vocab, device="cpu"
):
    """`groups` GRPO groups of `group_size` rows: prompts of `prompt` tokens whose first `prefix`
    are common to all groups, random completions of `completion` tokens; on `device`."""
    gen = torch.Generator().manual_seed(0)
    common = torch.randint(1, vocab, (prefix,), generator=gen)
    own = torch.randint(1, vocab, (groups, prompt - prefix), generator=gen)  # (G, P - S)
    prompts = torch.cat([common.expand(groups, -1), own], 1).repeat_interleave(group_size, 0)
    rows = groups * group_size
    completions = torch.randint(1, vocab, (rows, completion), generator=gen)  # (B, C)
    ids = torch.cat([prompts, completions], 1)  # (B, P + C)
    completion_mask = torch.zeros_like(ids, dtype=torch.bool)
    completion_mask[:, prompt:] = True
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "completion_mask": completion_mask,
        "advantages": torch.randn(rows, generator=gen),  # (B,)
        "prompt_lens": torch.full((rows,), prompt),  # (B,)
        "group_ids": torch.arange(groups).repeat_interleave(group_size),  # (B,)
    }
    return {k: v.to(device) for k, v in batch.items()}  # drawn on the CPU: one random stream


def _prefix(args) -> dict:
    from sparrow.rl.actor import DenseActor  # DeepSpeed: imported only when this runs

    name = "tiny-qwen3" if args.tiny else "smollm2-135m-instruct"
    actors = {}
    for share_prefix in (False, True):
        cfg = ActorConfig(
            zero_stage=0, precision="fp32", lr=1e-5, micro_batch_size=args.micro_batch_size,
            share_prompts=True, share_prefix=share_prefix,
        )  # fmt: skip
        actors[share_prefix] = DenseActor(load_model(ModelConfig(name)).model.to(args.device), cfg)
    vocab = actors[True].model.config.vocab_size
    batch = grouped_batch(GROUPS, GROUP_SIZE, PREFIX, PROMPT, COMPLETION, vocab, args.device)
    warmup = {k: v[:GROUP_SIZE] for k, v in batch.items()}  # first calls' one-off costs
    for actor in actors.values():
        _time_passes(actor, warmup)
    times: dict[bool, tuple[list[float], list[float]]] = {share: ([], []) for share in actors}
    for repeat in range(args.repeats):
        for share in (False, True) if repeat % 2 == 0 else (True, False):
            for i, seconds in enumerate(_time_passes(actors[share], batch)):
                times[share][i].append(seconds)
    result = {"model": name, "micro_batch_size": args.micro_batch_size, "n": args.repeats}
    for i, name in enumerate(("compute_logprobs", "train_step")):
        off, on = (statistics.median(times[share][i]) for share in (False, True))
        result[name] = {"off_s": round(off, 2), "on_s": round(on, 2), "ratio": round(off / on, 2)}
    return result


def _time_passes(actor, batch: dict) -> tuple[float, float]:
    start = time.perf_counter()
    actor.compute_logprobs(
        batch["input_ids"], batch["attention_mask"], topk=20,
        prompt_lens=batch["prompt_lens"], group_ids=batch["group_ids"],
    )  # fmt: skip
    middle = time.perf_counter()
    loss_fn = policy_gradient_loss(int(batch["completion_mask"].sum()))
    actor.train_step(actor.micro_batches(batch), loss_fn)
    return middle - start, time.perf_counter() - middle


def _memory(args) -> dict:
    from sparrow.rl.actor import DenseActor  # DeepSpeed: imported only when this runs

    model = memory_model(args.device)
    config = model.config
    cfg = ActorConfig(
        zero_stage=0, precision="fp32", micro_batch_size=args.group, share_prompts=True,
        max_tokens_per_micro_batch=args.max_tokens, activation_checkpointing=args.checkpointing,
    )  # fmt: skip
    actor = DenseActor(model, cfg)
    batch = grouped_batch(
        1, args.group, 0, MEMORY_PROMPT, MEMORY_COMPLETION, MEMORY_VOCAB, args.device
    )
    micro_batches = actor.micro_batches(batch)
    cuda = args.device.type == "cuda"
    before = _peak_bytes(args.device, reset=True)
    actor.train_step(micro_batches, policy_gradient_loss(int(batch["completion_mask"].sum())))
    peak = _peak_bytes(args.device)
    rows = max(len(mb["input_ids"]) for mb in micro_batches)
    estimate = micro_batch_activation_bytes(
        ModelShape.from_hf_config(config),
        micro_batch_decoder_tokens(rows, args.group, MEMORY_PROMPT, MEMORY_COMPLETION),
        args.checkpointing,
        cfg.logprob_chunk_tokens,
        bytes_per_value=4,
    )
    return {
        "group": args.group,
        "max_tokens_per_micro_batch": args.max_tokens,
        "checkpointing": args.checkpointing,
        "micro_batch_rows": [len(mb["input_ids"]) for mb in micro_batches],
        ("peak_cuda_growth_mib" if cuda else "peak_rss_growth_mib"): round(
            (peak - before) / 2**20, 1
        ),
        "estimate_mib": round(estimate / 2**20, 1),
    }


def _long_prompt(args) -> dict:
    from sparrow.rl.actor import DenseActor  # DeepSpeed: imported only when this runs
    from sparrow.train.config import RLConfig, RolloutConfig, SparrowConfig
    from sparrow.train.memory.plan import plan_memory

    group, prompt, completion = 6, 3200, 32
    cfg = ActorConfig(
        zero_stage=0, precision="fp32", micro_batch_size=args.groups * group,
        share_prompts=True, activation_checkpointing=True,
    )  # fmt: skip
    model = load_model(ModelConfig("smollm2-135m-instruct")).model.to(args.device)
    actor = DenseActor(model, cfg)
    vocab = model.config.vocab_size
    batch = grouped_batch(args.groups, group, 0, prompt, completion, vocab, args.device)
    cuda = args.device.type == "cuda"
    before = _peak_bytes(args.device, reset=True)
    start = time.perf_counter()
    if args.phase == "logprobs":
        with torch.no_grad():
            actor.compute_logprobs(
                batch["input_ids"], batch["attention_mask"], topk=8,
                prompt_lens=batch["prompt_lens"], group_ids=batch["group_ids"],
            )  # fmt: skip
    else:
        loss_fn = policy_gradient_loss(int(batch["completion_mask"].sum()))
        actor.train_step(actor.micro_batches(batch), loss_fn)
    peak = _peak_bytes(args.device)
    growth = peak - before
    run = SparrowConfig(
        rollout=RolloutConfig(max_new_tokens=completion),
        rl=RLConfig(group_size=group, prompts_per_step=args.groups),
        actor=cfg,
    )
    plan = plan_memory(run, ModelShape.from_hf_config(model.config), 1, cuda, prompt)
    phase = "actor log-probs" if args.phase == "logprobs" else "actor step"
    # Growth over the loaded model: the phase's peak less the weights and pool held before it;
    # AdamW's state is created in the first step, so it counts in the step's growth only.
    planned = plan.phases[phase] - plan.engine_resident
    if args.phase == "logprobs":
        planned -= plan.optimizer
    return {
        "groups": args.groups,
        "phase": args.phase,
        "seconds": round(time.perf_counter() - start, 1),
        ("peak_cuda_growth_gib" if cuda else "peak_rss_growth_gib"): round(growth / 2**30, 3),
        "plan_gib": round(planned / 2**30, 3),
    }


def memory_model(device) -> PreTrainedModel:
    """The `memory` measurement's tiny Qwen3 (hidden 256, 4 layers), seeded, on `device`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = tiny_model_config(
        "qwen3", vocab_size=MEMORY_VOCAB, hidden_size=256, intermediate_size=512, head_dim=64,
        max_position_embeddings=2048,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config).eval().to(device)


def _peak_bytes(device: torch.device, reset: bool = False) -> int:
    """CUDA's peak allocation on a GPU (`reset`: restart it here), else the process's peak RSS
    (which only grows: one measurement per process)."""
    if device.type == "cuda":
        if reset:
            torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-bench actor", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    sub = p.add_subparsers(dest="what", required=True)
    prefix = sub.add_parser("prefix", help="share_prefix on vs off: log-prob pass and update")
    prefix.add_argument("--repeats", type=at_least(1), default=3)
    prefix.add_argument("--micro-batch-size", type=at_least(1), default=16)  # conf/actor/cpu.yaml
    prefix.add_argument("--tiny", action="store_true", help="a tiny random Qwen3, not SmolLM2")
    memory = sub.add_parser("memory", help="peak memory of one update vs the activation estimate")
    memory.add_argument("group", type=at_least(1), help="rows of the one GRPO group")
    memory.add_argument(
        "max_tokens", type=at_least(0), help="actor token budget per micro-batch; 0: off"
    )
    memory.add_argument("--checkpointing", action="store_true")
    long_prompt = sub.add_parser("long-prompt", help="3.2K shared prompts: RSS vs the plan")
    long_prompt.add_argument("groups", type=at_least(1), help="groups of 6 rows")
    long_prompt.add_argument("phase", choices=("logprobs", "step"))
    args = p.parse_args(argv)
    args.device = torch.device(args.device) if args.device else bench_device()
    return args
