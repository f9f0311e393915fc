"""DistillSparse: one adapter update per RL step, after the dense update (docs/DESIGN.md
§1 and §3).

    distill = DistillSparse(cfg.distill, model, engine.sparse_settings, actor_lr=cfg.actor.lr)
    ...  # after the dense GRPO update of theta:
    distill.load_base(theta_state_dict)          # theta frozen inside the sparse policy
    metrics = distill.step(batch, dense.token_logprobs, advantages_tok, temperature)
    # cfg.gate (default): theta in the engine's weights, phi acts only at sparse decode steps
    engine.update_weights(theta_state_dict)
    engine.set_lora(distill.lora_factors())
    # cfg.gate=False: theta + phi merged, at every token
    engine.update_weights(distill.merged_state_dict())

The adapter phi has its own AdamW optimizer; the loss is sparrow.distill.loss over the rollout,
run through the training-time block-sparse attention with the budgets the engine recorded.
With several data-parallel ranks every rank calls `step` on its own rollouts, with the step's
global token count, and the adapter gradients are summed over ranks so phi stays identical.
"""

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from sparrow.distill.loss import distill_loss
from sparrow.distill.sparse_policy import SparsePolicy
from sparrow.distributed import Ranks
from sparrow.rl.batch import RolloutBatch
from sparrow.rl.shared_prompt_passes import common_prefix_len
from sparrow.rollout.paged_attention import SparseAttentionConfig


@dataclass
class DistillConfig:
    enabled: bool = False  # train a LoRA for the sparse rollout policy after each dense update
    rank: int = 16  # LoRA rank r
    alpha: float = 32.0  # LoRA alpha: the update B A is scaled by alpha / rank
    dropout: float = 0.0  # LoRA dropout on the adapter's input
    target_modules: str = "all-linear"  # peft targets: every linear layer but the LM head
    lr_factor: float = 10.0  # adapter AdamW learning rate = lr_factor x the actor's lr
    lambda_k3: float = 1e-3  # weight of k3(logp_dense_old - logp_sparse) (Sparrow's code: 1e-3)
    pg_coef: float = 1.0  # weight of the sparse GRPO term (0: pure distillation to dense)
    lambda_kl: float = 0.0  # weight of KL(dense_old || sparse) over the dense top-K + rest bucket
    grad_clip: float = 1.0  # clip the adapter's gradient 2-norm to this; 0 disables clipping
    micro_batch_size: int = 4  # sequences per sparse forward + backward
    gate: bool = True  # phi only at sparse decode steps (budget < pages); False: merged everywhere
    # gated: the prompt prefix a micro-batch's rows share (a group's whole prompt) runs once
    # without grad, not once per row (the same loss and gradient up to fp32 round-off;
    # SparsePolicy.shared_prefix)
    share_prefix: bool = True

    def __post_init__(self):
        if self.rank < 1 or self.micro_batch_size < 1:
            raise ValueError(
                f"distill.rank and distill.micro_batch_size must be >= 1, got {self.rank}, "
                f"{self.micro_batch_size}"
            )
        if self.lr_factor <= 0 or min(self.lambda_k3, self.pg_coef, self.lambda_kl) < 0:
            raise ValueError("distill.lr_factor must be > 0, lambda_k3, lambda_kl, pg_coef >= 0")


class DistillSparse:
    def __init__(
        self,
        cfg: DistillConfig,
        base_model,
        attn: SparseAttentionConfig,
        actor_lr: float,
        init_seed: int = 0,
        dropout_seed: int = 0,
    ):
        """base_model: the HF policy with the dense weights (copied, not modified); attn: the
        engine's sparse attention settings (`engine.sparse_settings`), so selection matches.
        init_seed: the adapter's initialisation (the same on every rank: phi stays identical);
        dropout_seed: its dropout masks, + the adapter step (one stream per rank)."""
        self.cfg = cfg
        self.dropout_seed = dropout_seed
        self.device = next(base_model.parameters()).device
        with _seeded(init_seed, self.device):
            self.policy = SparsePolicy(
                base_model,
                attn,
                rank=cfg.rank,
                alpha=cfg.alpha,
                dropout=cfg.dropout,
                target_modules=cfg.target_modules,
                gate=cfg.gate,
            )
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.lr_factor * actor_lr, weight_decay=0.0
        )
        self.num_steps = 0

    def step(
        self,
        batch: RolloutBatch,
        dense_logprobs: Tensor,
        advantages_tok: Tensor,
        temperature: float,
        global_num_tokens: float | None = None,
        dense_topk: tuple[Tensor, Tensor] | None = None,
    ) -> dict[str, float]:
        """One adapter update over the rollout batch.

        dense_logprobs: (B, T) the dense policy's log-probs of batch.input_ids before this step's
        update, aligned as in RolloutBatch; advantages_tok: (B, T) per-token advantages;
        temperature: the rollout's (0, greedy, scores at 1); global_num_tokens: completion tokens
        over all ranks (default: this batch's); dense_topk: (ids (B, T, K), log-probs (B, T, K))
        of the same dense pass, needed when lambda_kl > 0. Returns metrics under `distill/`.
        """
        if self.cfg.lambda_kl > 0 and dense_topk is None:
            raise ValueError("distill.lambda_kl > 0 needs the dense top-K (dense_topk=...)")
        use_topk = self.cfg.lambda_kl > 0
        temperature = temperature if temperature > 0 else 1.0
        num_tokens = global_num_tokens or max(int(batch.completion_mask.sum()), 1)
        totals: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        whole = prefix = None
        if self.cfg.share_prefix:
            whole = prefix = self.policy.shared_prefix(batch.input_ids, batch.prompt_lens)
        # Dropout masks from a stream of the adapter's own: the same on a resumed run.
        with _seeded(self.dropout_seed + self.num_steps, self.device):
            for start in range(0, len(batch), self.cfg.micro_batch_size):
                rows = slice(start, start + self.cfg.micro_batch_size)
                if self.cfg.share_prefix:
                    prefix = self._micro_batch_prefix(batch, rows, whole, prefix)
                loss, metrics = self._micro_batch_loss(
                    batch, rows, prefix, dense_logprobs, advantages_tok, temperature, num_tokens,
                    dense_topk if use_topk else None,
                )  # fmt: skip
                loss.backward()
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + float(value)
        grad_norm = self._update_adapter()
        return {f"distill/{k}": v for k, v in totals.items()} | {"distill/grad_norm": grad_norm}

    def _micro_batch_loss(
        self,
        batch: RolloutBatch,
        rows: slice,
        prefix,
        dense_logprobs: Tensor,
        advantages_tok: Tensor,
        temperature: float,
        num_tokens: float,
        dense_topk: tuple[Tensor, Tensor] | None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """distill_loss of the sparse policy on the batch's `rows`, scored against the dense
        pass's log-probs (and its top-K when given: the KL term reads the sparse policy's
        log-probs at the dense top-K ids)."""
        mask = batch.completion_mask[rows]  # (b, T)
        logprobs, topk_logprobs = self.policy.token_logprobs(
            batch.input_ids[rows],
            mask,
            batch.budget_pages[rows],
            temperature,
            topk_ids=dense_topk[0][rows] if dense_topk is not None else None,
            prefix=prefix,
        )  # (b, T), (b, T, K) or None
        device = logprobs.device
        return distill_loss(
            logprobs,
            dense_logprobs[rows].to(device),
            advantages_tok[rows].to(device),
            mask.to(device),
            num_tokens,
            pg_coef=self.cfg.pg_coef,
            lambda_k3=self.cfg.lambda_k3,
            lambda_kl=self.cfg.lambda_kl,
            dense_topk_logprobs=dense_topk[1][rows].to(device) if dense_topk is not None else None,
            sparse_topk_logprobs=topk_logprobs,
        )

    def _update_adapter(self) -> float:
        """Sum phi's gradients over ranks, clip, take the optimizer step; the gradient norm
        before clipping."""
        params = self.policy.parameters()
        # Each rank's loss is already divided by the global token count: the sum is the mean.
        Ranks.of_process_group().sum_gradients_(params)
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.num_steps += 1
        return grad_norm

    def _micro_batch_prefix(self, batch: RolloutBatch, rows: slice, whole, last):
        """The prompt prefix the micro-batch's rows share (a GRPO group's whole prompt less one
        token when the rows are one group's): `last` when it is the same tokens (the previous
        micro-batch was the same group's), else the batch's prefix `whole` extended."""
        ids, lens = batch.input_ids[rows], batch.prompt_lens[rows]
        length = common_prefix_len(ids, lens)
        if last is not None and last.length == length and torch.equal(last.tokens, ids[0, :length]):
            return last
        return self.policy.shared_prefix(ids, lens, start=whole)

    def merged_state_dict(self) -> dict[str, Tensor]:
        """theta + phi, HF-named, for `LLMEngine.update_weights`."""
        return self.policy.merged_state_dict()

    def lora_factors(self) -> dict[str, tuple[Tensor, Tensor]]:
        """phi as (A, scaled B) per HF module name, for `LLMEngine.set_lora` (gated mode)."""
        return self.policy.lora_factors()

    def load_base(self, state_dict: dict[str, Tensor]) -> None:
        """Take the dense actor's updated theta (HF names) as the frozen base."""
        self.policy.load_base(state_dict)

    def state_dict(self) -> dict:
        """Adapter, optimizer and step count (theta is the actor's, checkpointed there)."""
        return {
            "adapter": self.policy.adapter_state_dict(),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "num_steps": self.num_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_adapter_state_dict(state["adapter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_steps = state["num_steps"]


@contextmanager
def _seeded(seed: int, device: torch.device):
    """Draw from torch's generators (the CPU's and `device`'s when it is a GPU) seeded with
    `seed`, leaving their state outside as it was."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
