"""The trainer's step pieces on fake tensors at the real Qwen3-1.7B shape, through sparrow's own
code, in the order `Trainer.train_step` runs them (harness.py):

1. dense log-probs of one token-budget micro-batch (`PolicyWithLogprobs`, the module DeepSpeed
   wraps, no grad) on the fake GPU;
2. the weight sync of the actor's weights into the engine (`LLMEngine.update_weights`);
3. forward + backward of that micro-batch with activation checkpointing
   (`checkpoint_decoder_layers`) and the GRPO loss (`PolicyLoss`), on fake *CPU* tensors:
   autograd on fake CUDA aborts the process on a CPU-only torch;
4. one DistillSparse update (`DistillSparse.step`: the sparse policy's training-time page
   selection and gathering attention, backward, AdamW), on fake CPU tensors likewise;
5. its sync into the engine (theta, then phi as an unmerged LoRA) and a sparse decode step that
   applies the LoRA's gate, on the fake GPU.
The batch is one GRPO group of two rows, each a 4K-token prompt and a 28K-token completion: a
micro-batch of the preset's 32K-token budget holds one row. DistillSparse runs on a short row
(`distill_tokens`): at 32K tokens `query_chunk` cuts each sparse layer into 8,192 chunks of 4
queries (2^24 elements per chunk over a 2 x 32K batch), far too many ops for a test (and on a
GPU, 8,192 chunks and page-union reads per layer: see DISTILL_READS in harness.py).

Not covered: DeepSpeed (`DenseActor`: its engine needs a process group; ZeRO's partitioning,
bf16 master weights and the optimizer states it adds), the backward's CUDA specifics (kernel
choices and memory of the CPU autograd graph stand in), and values.
"""

from dataclasses import dataclass

import torch
from harness import DISTILL_READS, ENGINE_READS, PRESET, fake_gpu, qwen3_model

from sparrow.cli.config_loader import load_config
from sparrow.control.controller import make_controller
from sparrow.distill.distill_sparse import DistillSparse
from sparrow.models.loading import tiny_tokenizer
from sparrow.rl.activation_checkpointing import checkpoint_decoder_layers
from sparrow.rl.batch import RolloutBatch
from sparrow.rl.losses import PolicyLoss
from sparrow.rl.micro_batches import take, token_budget_slices
from sparrow.rl.policy_logprobs import PolicyWithLogprobs
from sparrow.rollout.engine import LLMEngine, SamplingParams


@dataclass
class TrainerReport:
    logprob_shapes: list[tuple[int, ...]]  # LogprobOutput's fields
    micro_batches: list[slice]  # the token-budget cut of the batch
    grads: int  # parameters of the actor with a gradient after backward
    params: int  # parameters of the actor
    adapter_params: int  # DistillSparse's LoRA tensors (A and B of every linear layer)
    distill_metrics: dict[str, float]
    lora_modules: int  # LoRA factors synced into the engine
    gated_graphs: tuple[int, int, int]  # the engine's graphs (captured, replayed, eager)
    bytes: dict[str, int]  # phase -> bytes held at its peak beyond its start, on its device
    host_reads: dict[str, int]
    ops: dict[str, int]  # phase -> aten ops dispatched in it


def grpo_batch(prompt: int, completion: int, rows: int, vocab: int) -> dict[str, torch.Tensor]:
    """One GRPO group: `rows` samples of one `prompt`-token prompt, `completion` tokens each,
    with the rollout's log-probs and the step's advantages (the actor's train batch)."""
    length = prompt + completion
    ids = torch.randint(3, vocab, (rows, length))
    ids[:, :prompt] = ids[:1, :prompt]
    completion_mask = (torch.arange(length) >= prompt).expand(rows, length).clone()
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(rows, length, dtype=torch.bool),
        "completion_mask": completion_mask,
        "old_logprobs": -torch.rand(rows, length) * completion_mask,
        "rollout_logprobs": -torch.rand(rows, length) * completion_mask,
        "advantages": torch.randn(rows, 1) * completion_mask,
        "prompt_lens": torch.full((rows,), prompt),
        "group_ids": torch.zeros(rows, dtype=torch.long),
    }


def rehearse_trainer(
    *, prompt: int = 4096, completion: int = 28672, distill_tokens: int = 600
) -> TrainerReport:
    """The pieces above; the actor's batch is one group of two rows of `prompt` + `completion`
    tokens, DistillSparse's one row of `distill_tokens` (the schedule's first budget, 32 pages,
    makes its queries past 512 tokens sparse)."""
    cfg = load_config([*PRESET, "distill=default"])
    reads = ENGINE_READS | DISTILL_READS
    with fake_gpu(host_values=True, host_reads_at=reads) as h:
        vocab = 151936
        batch = grpo_batch(prompt, completion, rows=2, vocab=vocab)
        lengths = batch["attention_mask"].sum(1)
        slices = token_budget_slices(lengths, cfg.actor.max_tokens_per_micro_batch,
                                     batch["prompt_lens"], batch["group_ids"])  # fmt: skip
        mb = take(batch, slices[:1])[0]
        chunk, share = cfg.actor.logprob_chunk_tokens, cfg.actor.share_prefix

        # 1. Dense log-probs on the GPU, as DenseActor._forward moves a micro-batch there.
        actor_gpu = qwen3_model(cfg, "cuda")
        policy = PolicyWithLogprobs(actor_gpu, chunk, share).eval()
        keys = ("input_ids", "attention_mask", "prompt_lens", "group_ids")
        ids, mask, prompt_lens, group_ids = (mb[k].to("cuda") for k in keys)
        with h.live.phase("actor log-probs"), torch.no_grad():
            scores = policy(ids, mask, cfg.rollout.engine.topk_logprobs, cfg.rollout.temperature,
                            prompt_lens, group_ids)  # fmt: skip

        # 2. The actor's weights into the engine.
        engine = LLMEngine(actor_gpu, tiny_tokenizer(), cfg.rollout.engine)
        theta = actor_gpu.state_dict()
        with h.live.phase("weight sync"):
            engine.update_weights(theta)

        # 3. Forward + backward of the micro-batch, checkpointed, with the GRPO loss. As in the
        # trainer, DistillSparse copies the base weights before the actor wraps its layers.
        actor = qwen3_model(cfg, "cpu")
        distill = DistillSparse(cfg.distill, actor, engine.runner.kv.cfg, cfg.actor.lr)
        checkpoint_decoder_layers(actor.get_decoder())
        train_policy = PolicyWithLogprobs(actor, chunk, share).eval()
        num_tokens = float(batch["completion_mask"].sum())
        with h.live.phase("actor step"):
            out = train_policy(mb["input_ids"], mb["attention_mask"], 0, cfg.rollout.temperature,
                               mb["prompt_lens"], mb["group_ids"])  # fmt: skip
            loss, _ = PolicyLoss(cfg.rl.loss)(
                out[0], mb["old_logprobs"], mb["rollout_logprobs"], mb["advantages"],
                mb["completion_mask"], num_tokens,
            )  # fmt: skip
            loss.backward()
        params = list(actor.parameters())

        # 4. One DistillSparse update on a short batch, the rollout's budgets recorded.
        short = grpo_batch(distill_tokens // 4, distill_tokens - distill_tokens // 4, 1, vocab)
        schedule = make_controller(cfg.schedule, cfg.controller).schedule
        length = distill_tokens
        budgets = torch.tensor([schedule.budget_pages(t) for t in range(1, length + 1)])
        rollout = RolloutBatch(
            input_ids=short["input_ids"],
            attention_mask=short["attention_mask"],
            completion_mask=short["completion_mask"],
            prompt_lens=short["prompt_lens"],
            sampled_logprobs=short["rollout_logprobs"],
            topk_ids=torch.zeros(1, length, cfg.rollout.engine.topk_logprobs, dtype=torch.long),
            topk_logprobs=torch.zeros(1, length, cfg.rollout.engine.topk_logprobs),
            budget_pages=torch.where(short["completion_mask"], budgets, 0).to(torch.int32),
            group_ids=short["group_ids"],
            finish_reasons=["length"],
        )
        distill.load_base({k: v.to("cpu") for k, v in theta.items()})  # on a GPU: no copy
        with h.live.phase("distill step"):
            metrics = distill.step(rollout, short["old_logprobs"], short["advantages"],
                                   cfg.rollout.temperature)  # fmt: skip

        # 5. Theta and the unmerged, gated phi into the engine; a sparse decode step applies it.
        factors = {k: (a.to("cuda"), b.to("cuda")) for k, (a, b) in distill.lora_factors().items()}
        engine.set_lora(factors)
        engine.set_schedule(schedule.budget_pages)
        prompt_ids = [3 + i % 1000 for i in range(528)]  # 34 pages at the first decode step
        with h.live.phase("gated decode"):
            engine.generate([prompt_ids], SamplingParams(max_tokens=2, ignore_eos=True), n=2)

        graphs = engine.runner.graphs
        live = h.live.phases
        device = {"actor log-probs": "cuda", "weight sync": "cuda", "actor step": "cpu",
                  "distill step": "cpu", "gated decode": "cuda"}  # fmt: skip
        return TrainerReport(
            logprob_shapes=[tuple(s.shape) for s in scores],
            micro_batches=slices,
            grads=sum(p.grad is not None and p.grad.shape == p.shape for p in params),
            params=len(params),
            adapter_params=len(distill.policy.parameters()),
            distill_metrics=metrics,
            lora_modules=len(factors),
            gated_graphs=(graphs.num_captured, graphs.num_replayed, graphs.num_eager),
            bytes={k: live[k].peak[d] - live[k].start[d] for k, d in device.items()},
            host_reads=dict(h.guard.host_reads),
            ops={k: live[k].ops for k in device},
        )
