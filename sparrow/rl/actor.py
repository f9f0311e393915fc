"""The dense actor: an HF causal LM trained under DeepSpeed ZeRO (the only module importing it).

`DenseActor` owns the DeepSpeed engine around the policy. It answers two questions for the
trainer: dense log-probs (of the given tokens and the top-K per position) with the whole
(batch x length x vocab) logits tensor never materialised at once, and one optimizer update from
a list of micro-batches whose loss is already normalised by the global token count of the step.
It also gathers full weights for the rollout engine's sync, saves/loads DeepSpeed checkpoints and
exports the policy as an HF model directory. Given the GRPO group structure (`prompt_lens`,
`group_ids`) and `share_prompts`, both passes compute each group's prompt once per micro-batch,
and with `share_prefix` the prefix common to all its groups once (sparrow.rl.policy_logprobs).
Micro-batches (`micro_batches`, sparrow.rl.micro_batches) hold whole groups of
`micro_batch_size` rows, or up to `max_tokens_per_micro_batch` decoder tokens, splitting a group
that does not fit (long contexts); with `activation_checkpointing` the decoder layers are
recomputed in backward (sparrow.rl.activation_checkpointing).

Conventions: every per-token output is aligned to the position of the token it describes
(position 0 has no prediction and is 0), as in `sparrow.rl.batch.RolloutBatch`. The policy runs in
eval mode in both passes (no dropout), so the PPO ratio is exactly 1 on a step's first update.
Under ZeRO-3 every call here is a collective: all ranks call it with the same number of
micro-batches (checked, to fail loudly instead of hanging).
"""

import contextlib
import logging
import math
import os
import socket
import warnings
from collections.abc import Callable, Iterator
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn
from transformers import PreTrainedModel

# Before importing deepspeed: pick its CPU accelerator explicitly (it otherwise warns on import).
if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402

from sparrow.distributed import Ranks  # noqa: E402
from sparrow.rl import policy_adapter  # noqa: E402
from sparrow.rl.activation_checkpointing import checkpoint_decoder_layers  # noqa: E402
from sparrow.rl.actor_config import ActorConfig, lr_multiplier  # noqa: E402
from sparrow.rl.deterministic_backward import deterministic_backward  # noqa: E402
from sparrow.rl.micro_batches import (  # noqa: E402
    even_out,
    micro_batch_slices,
    take,
    token_budget_slices,
)
from sparrow.rl.op_build import op_build_guard  # noqa: E402
from sparrow.rl.policy_logprobs import (  # noqa: E402
    ForwardScores,
    LogprobOutput,
    PolicyWithLogprobs,
    RowLogits,
    Scores,
)
from sparrow.rl.shared_prompt_passes import check_shared_prompts  # noqa: E402
from sparrow.rollout.lora import wire_tensors  # noqa: E402
from sparrow.rollout.weight_push import plan_buckets  # noqa: E402

deepspeed.utils.logger.setLevel(logging.WARNING)
# DeepSpeed 0.19 calls these torch collectives under their deprecated names on every ZeRO step.
warnings.filterwarnings(
    "ignore",
    message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    category=FutureWarning,
)

LossFn = Callable[[Tensor, dict[str, Tensor]], tuple[Tensor, dict[str, Any]]]


class DenseActor:
    """DeepSpeed-wrapped dense policy: log-probs, GRPO updates, weight gather, checkpoints."""

    def __init__(self, model: PreTrainedModel, cfg: ActorConfig):
        self.cfg = cfg
        on_gpu = torch.cuda.is_available()
        _init_distributed("nccl" if on_gpu else "gloo", cfg.collective_timeout_min)
        self.bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and on_gpu)
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # LoRA RL: the adapter alone trains (and is what the optimizer holds state for).
        self.peft = policy_adapter.wrap(model, cfg.lora) if cfg.lora.rank else None
        if self.peft is not None:
            model = cast(PreTrainedModel, self.peft.base_model.model)  # LoRA layers injected
        if cfg.activation_checkpointing:
            checkpoint_decoder_layers(model.get_decoder())
        optimizer = _adamw(model, cfg)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, cfg))
        self.engine, _, _, _ = deepspeed.initialize(
            model=PolicyWithLogprobs(model, cfg.logprob_chunk_tokens, cfg.share_prefix),
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=self._deepspeed_config(),
        )
        self.engine.eval()
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.ranks = Ranks(self.rank, self.world_size)  # this actor's collectives
        # ZeRO-3 gathers the lm_head's weight at each of its calls, one per log-prob chunk.
        self.engine.module.uniform_head_calls = cfg.zero_stage == 3 and self.world_size > 1
        if self.world_size == 1 and cfg.zero_stage == 0:
            # A 1-rank all-reduce is the identity, but DeepSpeed would still copy every gradient
            # into and out of flat buffers (seconds per step for a 135M model on CPU).
            self.engine.enable_backward_allreduce = False

    @property
    def model(self) -> PreTrainedModel:
        """The wrapped HF model (its parameters are partitioned under ZeRO-3)."""
        return self.engine.module.lm

    def _deepspeed_config(self) -> dict[str, Any]:
        return {
            "train_micro_batch_size_per_gpu": self.cfg.micro_batch_size,
            "gradient_accumulation_steps": 1,  # set per train_step to the micro-batch count
            # Stage 0 in fp32 clips in train_step (DeepSpeed would not report its norm).
            "gradient_clipping": 0.0 if self._checks_grads_itself() else self.cfg.grad_clip,
            "zero_optimization": self._zero_config(),
            "bf16": {"enabled": self.bf16, "check_grad_overflow": True},
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }

    def _zero_config(self) -> dict[str, Any]:
        """ZeRO's section: the stage, and ZeRO-Offload's host-RAM placements (pinned on a GPU,
        for the asynchronous copies; the CPU accelerator has nothing to pin)."""
        zero: dict[str, Any] = {"stage": self.cfg.zero_stage}
        pin = torch.cuda.is_available()
        if self.cfg.offload_optimizer == "cpu":
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
        if self.cfg.offload_params == "cpu":
            zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
        return zero

    def partition_frozen(self, policy: nn.Module) -> nn.Module:
        """A frozen module beside the actor (the KL reference), held as the actor's weights are:
        under ZeRO-3 a DeepSpeed engine without an optimizer partitions it over the ranks and
        gathers each layer for its forward (in the actor's precision); below stage 3 every rank
        keeps the whole module, returned as it is."""
        if self.cfg.zero_stage != 3:
            return policy
        config = {
            "train_micro_batch_size_per_gpu": self.cfg.micro_batch_size,
            "zero_optimization": {"stage": 3},
            "bf16": {"enabled": self.bf16},
            "steps_per_print": 2**31 - 1,
        }
        engine, _, _, _ = deepspeed.initialize(model=policy, config=config)
        engine.eval()
        engine.module.uniform_head_calls = self.world_size > 1  # as the actor's own pass
        return engine

    def _checks_grads_itself(self) -> bool:
        # ZeRO 1-3 and the bf16 optimizer skip a step on a non-finite gradient norm themselves;
        # plain fp32 stage 0 steps torch's AdamW directly, so the check happens here.
        return self.cfg.zero_stage == 0 and not self.bf16

    @torch.no_grad()
    def compute_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        topk: int,
        temperature: float = 1.0,
        prompt_lens: Tensor | None = None,
        group_ids: Tensor | None = None,
    ) -> LogprobOutput:
        """Dense log-probs of `input_ids` (B, T) and the top-`topk` per position, fp32.

        prompt_lens, group_ids (B,): the GRPO group structure (rows of a group consecutive and
        sharing one prompt); with `share_prompts` each group's prompt is computed once.
        """
        groups = self._groups(input_ids, attention_mask, prompt_lens, group_ids)
        slices = self.micro_batch_rows(attention_mask, *(groups or (None, None)))
        self._check_same_count_on_all_ranks(len(slices), "compute_logprobs micro-batches")
        outs = []
        for sl in slices:
            mb_groups = None if groups is None else (groups[0][sl], groups[1][sl])
            scores = self._forward(input_ids[sl], attention_mask[sl], topk, temperature, mb_groups)
            outs.append(LogprobOutput(*scores))
        device = input_ids.device
        columns = (torch.cat([getattr(o, f.name) for o in outs]) for f in fields(LogprobOutput))
        return LogprobOutput(*(c.to(device) for c in columns))

    def micro_batches(self, batch: dict[str, Tensor]) -> list[dict[str, Tensor]]:
        """`batch` (rows along dim 0: input_ids, attention_mask, and prompt_lens and group_ids
        when prompts are shared) cut into this actor's micro-batches for `train_step`."""
        shared = self.cfg.share_prompts and "group_ids" in batch and "prompt_lens" in batch
        groups = (batch["prompt_lens"], batch["group_ids"]) if shared else (None, None)
        return take(batch, self.micro_batch_rows(batch["attention_mask"], *groups))

    def micro_batch_rows(
        self,
        attention_mask: Tensor,
        prompt_lens: Tensor | None = None,
        group_ids: Tensor | None = None,
    ) -> list[slice]:
        """Row ranges of the micro-batches, as many on every rank (a collective when a token
        budget is set: ranks with fewer split their widest micro-batches)."""
        budget = self.cfg.max_tokens_per_micro_batch
        if budget == 0:
            return micro_batch_slices(len(attention_mask), self.cfg.micro_batch_size, group_ids)
        lengths = attention_mask.sum(1).cpu()  # (B,)
        if prompt_lens is not None and group_ids is not None:  # shared prompts
            slices = token_budget_slices(lengths, budget, prompt_lens.cpu(), group_ids.cpu())
        else:
            slices = token_budget_slices(lengths, budget)
        if self.world_size > 1:
            slices = even_out(slices, int(self.ranks.extreme([len(slices)], "max")))
        return slices

    def _groups(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        prompt_lens: Tensor | None,
        group_ids: Tensor | None,
    ) -> tuple[Tensor, Tensor] | None:
        """(prompt_lens, group_ids) when this forward shares prompts (checked), else None."""
        if not self.cfg.share_prompts or prompt_lens is None or group_ids is None:
            return None
        check_shared_prompts(input_ids, attention_mask, prompt_lens, group_ids)
        return prompt_lens, group_ids

    def _forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        topk: int,
        temperature: float,
        groups: tuple[Tensor, Tensor] | None = None,
        exact: tuple[Tensor, RowLogits] | None = None,
    ) -> Scores:
        """The policy's scores of one micro-batch (LogprobOutput's fields); `exact`: (the rows'
        prompt lengths (b,), their rollout logits) adds their exact acceptance as a fifth."""
        device = self.engine.device
        extra: tuple = () if groups is None else tuple(g.to(device) for g in groups)
        if exact is not None:  # per row: the prompt lengths place the completions
            extra = (extra or (exact[0].to(device), None)) + (exact[1],)
        return self.engine(
            input_ids.to(device), attention_mask.to(device), topk, temperature, *extra
        )

    def train_step(
        self,
        micro_batches: list[dict[str, Tensor]],
        loss_fn: LossFn,
        temperature: float = 1.0,
        keep: ForwardScores | None = None,
    ) -> dict[str, float]:
        """One optimizer update from `micro_batches` (each holds input_ids and attention_mask,
        and `prompt_lens` and `group_ids` to share each group's prompt, see compute_logprobs).

        keep: gets each micro-batch's detached scores (top-`keep.topk` too), so the step needs
        no second dense pass (rl.dense_pass=update); with `rollout_logits` in a micro-batch (a
        list, per row (C_b, V) or None) also its rows' exact acceptance, from the same chunks.

        loss_fn(new_logprobs (b, T) fp32 at `temperature`, micro_batch) -> (loss, metrics),
        called with every tensor of the micro-batch on the actor's device; the loss must be
        normalised by the global token count of the step, so that the gradient applied is the
        plain sum over micro-batches and ranks and does not depend on how the batch is split.
        Returned `loss` and loss_fn metrics are summed over micro-batches and ranks (normalise
        metrics like the loss to get global means); `entropy` is the global token mean over
        `completion_mask` (or attention_mask); `skipped` is 1 when a non-finite loss or gradient
        cancelled the update (weights, optimizer and LR schedule untouched).
        """
        num_micro = len(micro_batches)
        self._check_same_count_on_all_ranks(num_micro, "train_step micro-batches")
        self.engine.set_train_batch_size(self.cfg.micro_batch_size * num_micro * self.world_size)
        sums: dict[str, float] = {"loss": 0.0, "entropy_sum": 0.0, "entropy_count": 0.0}
        groups = [
            self._groups(
                mb["input_ids"], mb["attention_mask"], mb.get("prompt_lens"), mb.get("group_ids")
            )
            for mb in micro_batches
        ]  # checked on the host, before any collective
        for i, mb in enumerate(micro_batches):
            out, mb = self._train_forward(mb, temperature, groups[i], keep)
            loss, metrics = loss_fn(out[0], mb)  # the token log-probs, with grad
            self.engine.set_gradient_accumulation_boundary(i == num_micro - 1)
            # DeepSpeed averages gradients over data-parallel ranks; the loss is a share of a
            # global sum, so undo the average. scale_wrt_gas=False: no division by micro-batches.
            # Deterministic: the shared prompt's cache rows would sum in thread order on CPU.
            with deterministic_backward(self.engine.device):
                self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
            mask = mb.get("completion_mask", mb["attention_mask"]).bool()
            sums["loss"] += float(loss.detach())
            sums["entropy_sum"] += float(out[3][mask].sum())  # the entropy
            sums["entropy_count"] += float(mask.sum())
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        grad_norm, skipped = self._optimizer_step()
        totals = self.ranks.sums(sums)
        entropy_sum, entropy_count = totals.pop("entropy_sum"), totals.pop("entropy_count")
        totals["entropy"] = entropy_sum / max(entropy_count, 1.0)
        totals["grad_norm"] = grad_norm
        totals["skipped"] = float(skipped)
        totals["lr"] = self.lr
        return totals

    def _train_forward(
        self,
        mb: dict[str, Tensor],
        temperature: float,
        groups: tuple[Tensor, Tensor] | None,
        keep: ForwardScores | None,
    ) -> tuple[Scores, dict[str, Tensor]]:
        """train_step's forward of one micro-batch: (its scores, the micro-batch on the
        device); their detached copy goes to `keep` when given."""
        row_logits = cast(RowLogits | None, mb.get("rollout_logits"))  # a list, stays on host
        exact = None if row_logits is None else (mb["prompt_lens"], row_logits)
        mb = {k: v.to(self.engine.device) for k, v in mb.items() if k != "rollout_logits"}
        topk = 0 if keep is None else keep.topk
        out = self._forward(mb["input_ids"], mb["attention_mask"], topk, temperature, groups, exact)
        if keep is not None:
            keep.add(out)
        return out, mb

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step will use."""
        return float(self.engine.get_lr()[0])

    def _optimizer_step(self) -> tuple[float, bool]:
        """Apply the accumulated gradient unless it is non-finite; return (grad norm, skipped)."""
        if self._checks_grads_itself():
            params = [p for p in self.model.parameters() if p.grad is not None]
            # Stage 0 has all-reduced full gradients at the boundary: the norm is global.
            max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            if not math.isfinite(grad_norm):
                self.engine.zero_grad()
                return grad_norm, True
            self.engine.step()
            return grad_norm, False
        self.engine.step()
        grad_norm = self.engine.get_global_grad_norm()
        grad_norm = math.nan if grad_norm is None else float(grad_norm)
        return grad_norm, not self.engine.was_step_applied()

    def _check_same_count_on_all_ranks(self, count: int, what: str) -> None:
        low, high = self.ranks.bounds(count)
        if low != high:
            raise ValueError(f"{what}: ranks differ ({int(low)}..{int(high)})")

    def gathered_state_dict(self) -> dict[str, Tensor]:
        """Full HF-named weights on every rank (collective under ZeRO-3), for the engine sync;
        with a LoRA adapter the merged policy's (W + s B A, fresh tensors).

        Below ZeRO-3 the tensors alias the live weights: copy them before the next train_step
        if they must outlive it.
        """
        if self.peft is not None:
            names = policy_adapter.base_names(self.model)
            base = self._gathered_state_dict()
            state = {names[k]: v for k, v in base.items() if k in names}
            return policy_adapter.merged_state_dict(state, self.adapter_factors())
        return self._gathered_state_dict()

    def adapter_factors(self) -> dict[str, tuple[Tensor, Tensor]]:
        """The LoRA adapter as the engine takes it (policy_adapter.factors), whole on every rank
        (a collective under ZeRO-3)."""
        assert self.peft is not None, "actor.lora.rank is 0: the actor has no adapter"
        with self._gathered(policy_adapter.adapter_parameters(self.model)):
            return policy_adapter.factors(self.model)

    @torch.no_grad()
    def base_token_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        temperature: float,
        groups: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """(b, T) fp32 token log-probs of one micro-batch under the base, the adapter disabled
        for the pass (peft's disable_adapter): a LoRA run's KL reference, no second copy."""
        assert self.peft is not None, "actor.lora.rank is 0: the actor has no adapter"
        with self.peft.disable_adapter():
            return self._forward(input_ids, attention_mask, 0, temperature, groups)[0]

    @staticmethod
    def _gathered(params: list) -> contextlib.AbstractContextManager:
        partitioned = [p for p in params if hasattr(p, "ds_id")]
        if not partitioned:
            return contextlib.nullcontext()
        return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)

    def _gathered_state_dict(self) -> dict[str, Tensor]:
        gathered: dict[int, Tensor] = {}
        out = {}
        for name, tensor in self.model.state_dict(keep_vars=True).items():
            if id(tensor) not in gathered:  # tied weights appear under two names
                if hasattr(tensor, "ds_id"):
                    with deepspeed.zero.GatheredParameters([tensor], modifier_rank=None):
                        gathered[id(tensor)] = tensor.detach().clone()
                else:
                    gathered[id(tensor)] = tensor.detach()
            out[name] = gathered[id(tensor)]
        return out

    def weight_buckets(
        self, bucket_bytes: int, dtype: torch.dtype
    ) -> Iterator[list[tuple[str, Tensor]]]:
        """The policy's weights a bucket at a time, for a weight push: see `parameter_buckets`
        (a collective under ZeRO-3: every rank of the actor draws every bucket); with a LoRA
        adapter the adapter alone, as `sparrow.rollout.lora.wire_tensors` (whole on every rank)."""
        if self.peft is not None:
            tensors = list(wire_tensors(self.adapter_factors()))
            sizes = [t.numel() * max(t.dtype.itemsize, dtype.itemsize) for _, t in tensors]
            return iter([[tensors[i] for i in b] for b in plan_buckets(sizes, bucket_bytes)])
        return parameter_buckets(self.model, bucket_bytes, dtype)

    def save_checkpoint(self, directory: str | Path) -> None:
        """DeepSpeed checkpoint (weights, optimizer, LR schedule) into `directory`; all ranks."""
        self.engine.save_checkpoint(str(directory), tag="deepspeed", save_latest=False)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what save_checkpoint wrote; all ranks."""
        path, _ = self.engine.load_checkpoint(str(directory), tag="deepspeed")
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {directory}")
        # The configured peak LR wins over the checkpoint's: resuming with a lower actor.lr
        # (say after a divergence) must take effect, not be overwritten by the saved schedule.
        scheduler = self.engine.lr_scheduler
        scheduler.base_lrs = [self.cfg.lr] * len(scheduler.base_lrs)
        lr = self.cfg.lr * lr_multiplier(scheduler.last_epoch, self.cfg)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def export_hf(self, directory: str | Path, tokenizer: Any = None) -> None:
        """Write the policy as an HF model directory (rank 0 writes; all ranks must call)."""
        state = self.gathered_state_dict()
        if self.rank == 0:
            self.model.save_pretrained(str(directory), state_dict=state)
            if tokenizer is not None:
                tokenizer.save_pretrained(str(directory))
        if self.peft is not None:  # the adapter too, in peft's format, under `adapter/`
            with self._gathered(policy_adapter.adapter_parameters(self.model)):
                if self.rank == 0:
                    self.peft.save_pretrained(str(Path(directory) / "adapter"))
        self.ranks.barrier()


def _adamw(model: nn.Module, cfg: ActorConfig) -> torch.optim.Optimizer:
    """AdamW, decay on matrices only. Under ZeRO-Offload it is DeepSpeed's CPUAdam (AdamW mode,
    a JIT-built C++ op), the optimizer DeepSpeed's offload steps on the host; it refuses torch's."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]  # a LoRA adapter (actor.lora) has matrices only
    betas = (cfg.betas[0], cfg.betas[1])  # a config list as AdamW's pair
    if cfg.offload_optimizer == "cpu":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        with op_build_guard("cpu_adam"):  # built on first use: no start-up behind a killed build
            return DeepSpeedCPUAdam(groups, lr=cfg.lr, betas=betas, adamw_mode=True)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas)


def parameter_buckets(
    model: nn.Module, bucket_bytes: int, dtype: torch.dtype
) -> Iterator[list[tuple[str, Tensor]]]:
    """`model`'s parameters (HF names, a tied one once, under its first name) a bucket at a time,
    for a weight push in `dtype` (sparrow.rollout.weight_push): a bucket holds at most
    `bucket_bytes` in the larger of the parameter's and `dtype`'s element sizes, a larger tensor
    alone. ZeRO-3-partitioned parameters are gathered one bucket at a time, just while it is
    drawn, so a rank never holds more than one bucket (or one tensor larger than a bucket) of
    gathered weights. The tensors alias the live weights: valid until the next bucket is drawn."""
    named = list(model.named_parameters())
    sizes = [
        getattr(p, "ds_numel", p.numel()) * max(p.dtype.itemsize, dtype.itemsize) for _, p in named
    ]
    for bucket in plan_buckets(sizes, bucket_bytes):
        partitioned = [named[i][1] for i in bucket if hasattr(named[i][1], "ds_id")]
        gathered = (
            deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)
            if partitioned
            else contextlib.nullcontext()
        )
        with gathered:
            yield [(named[i][0], named[i][1].detach()) for i in bucket]


def _init_distributed(backend: str, timeout_min: float) -> None:
    """Join (or create) the process group, whose collectives give up after `timeout_min`; a
    plain `python` run becomes a 1-rank group."""
    if not dist.is_initialized() and "WORLD_SIZE" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    _leave_shm_comm_unbuilt()
    deepspeed.init_distributed(
        dist_backend=backend,
        auto_mpi_discovery=False,
        verbose=False,
        timeout=timedelta(minutes=timeout_min),
    )


def _leave_shm_comm_unbuilt() -> None:
    """Keep DeepSpeed's CPU backend from JIT-building its shared-memory all-reduce op.

    On the CPU accelerator every `init_distributed` compiles (or re-checks) `deepspeed_shm_comm`
    under torch's extension lock file, `$TORCH_EXTENSIONS_DIR/deepspeed_shm_comm/lock`. A start-up
    killed while holding it leaves the file, and torch then polls for it forever, printing
    nothing: every later start-up hung silently. The op serves only DeepSpeed's
    `inference_all_reduce` (AutoTP inference), which sparrow never calls; marked incompatible, it
    is not built and every collective here stays torch.distributed's, as before. It also saves
    the ~1 min compile of a first start-up. Other accelerators have no such op (None)."""
    builder = deepspeed.get_accelerator().get_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
