"""A plain-torch stand-in for `DenseActor` (same interface, no DeepSpeed, one rank), so that the
whole GRPO loop runs in a test in seconds. The log-probs come from the same `PolicyWithLogprobs`
module the real actor wraps; the update is AdamW with the same LR schedule and gradient clipping
as the actor's ZeRO-0 fp32 path."""

import math
from pathlib import Path

import torch
from torch import Tensor, nn

from sparrow.rl.actor_config import ActorConfig, lr_multiplier
from sparrow.rl.micro_batches import micro_batch_slices, take, token_budget_slices
from sparrow.rl.policy_logprobs import LogprobOutput, PolicyWithLogprobs
from sparrow.rl.shared_prompt_passes import check_shared_prompts


class FakeActor:
    def __init__(self, model: nn.Module, cfg: ActorConfig):
        self.cfg = cfg
        self.rank, self.world_size = 0, 1
        self.policy = PolicyWithLogprobs(model, cfg.logprob_chunk_tokens).eval()
        decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=cfg.lr,
            betas=tuple(cfg.betas),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_multiplier(s, cfg)
        )

    @property
    def model(self) -> nn.Module:
        return self.policy.lm

    def partition_frozen(self, policy: nn.Module) -> nn.Module:
        return policy  # one rank, no ZeRO: the whole module, as DenseActor below stage 3

    def micro_batches(self, batch: dict[str, Tensor]) -> list[dict[str, Tensor]]:
        """The real actor's cut (whole groups by rows, or a token budget), on one rank."""
        shared = self.cfg.share_prompts and "group_ids" in batch and "prompt_lens" in batch
        prompt_lens, group_ids = (
            (batch["prompt_lens"], batch["group_ids"]) if shared else (None,) * 2
        )
        budget = self.cfg.max_tokens_per_micro_batch
        if budget:
            lengths = batch["attention_mask"].sum(1)  # (B,)
            return take(batch, token_budget_slices(lengths, budget, prompt_lens, group_ids))
        rows = len(batch["attention_mask"])
        return take(batch, micro_batch_slices(rows, self.cfg.micro_batch_size, group_ids))

    def _groups(self, mb: dict) -> tuple:
        if not self.cfg.share_prompts or mb.get("prompt_lens") is None:
            return ()
        check_shared_prompts(
            mb["input_ids"], mb["attention_mask"], mb["prompt_lens"], mb["group_ids"]
        )
        return mb["prompt_lens"], mb["group_ids"]

    @torch.no_grad()
    def compute_logprobs(
        self, input_ids, attention_mask, topk, temperature=1.0, prompt_lens=None, group_ids=None
    ) -> LogprobOutput:
        mb = {"input_ids": input_ids, "attention_mask": attention_mask}
        mb |= {"prompt_lens": prompt_lens, "group_ids": group_ids}
        return LogprobOutput(
            *self.policy(input_ids, attention_mask, topk, temperature, *self._groups(mb))
        )

    def train_step(
        self, micro_batches: list[dict[str, Tensor]], loss_fn, temperature=1.0, keep=None
    ) -> dict:
        sums = {"loss": 0.0, "entropy_sum": 0.0, "entropy_count": 0.0}
        for mb in micro_batches:
            groups = self._groups(mb)
            row_logits = mb.get("rollout_logits")  # the real actor's call: DenseActor._forward
            if row_logits is not None:
                groups = (groups or (mb["prompt_lens"], None)) + (row_logits,)
            mb = {k: v for k, v in mb.items() if k != "rollout_logits"}
            topk = 0 if keep is None else keep.topk
            out = self.policy(mb["input_ids"], mb["attention_mask"], topk, temperature, *groups)
            if keep is not None:
                keep.add(out)
            loss, metrics = loss_fn(out[0], mb)
            loss.backward()
            mask = mb.get("completion_mask", mb["attention_mask"]).bool()
            sums["loss"] += float(loss.detach())
            sums["entropy_sum"] += float(out[3][mask].sum())
            sums["entropy_count"] += float(mask.sum())
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
            self.scheduler.step()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.zero_grad(set_to_none=True)
        entropy = sums.pop("entropy_sum") / max(sums.pop("entropy_count"), 1.0)
        return sums | {
            "entropy": entropy,
            "grad_norm": grad_norm,
            "skipped": float(skipped),
            "lr": lr,
        }

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step will use (DenseActor.lr)."""
        return self.optimizer.param_groups[0]["lr"]

    def gathered_state_dict(self) -> dict[str, Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def save_checkpoint(self, directory: str | Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        torch.save(state | {"scheduler": self.scheduler.state_dict()}, Path(directory) / "fake.pt")

    def load_checkpoint(self, directory: str | Path) -> None:
        state = torch.load(Path(directory) / "fake.pt")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def export_hf(self, directory: str | Path, tokenizer=None) -> None:
        self.model.save_pretrained(str(directory))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(directory))
