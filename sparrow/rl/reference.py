"""The frozen reference policy of a KL-to-reference loss (rl.loss.kl_coef > 0): the run's initial
weights, copied before the actor wraps (and under ZeRO-3 partitions) the model, so a resumed run
keeps the reference of its first launch (the checkpoint is loaded into the actor afterwards).

Its log-probs are taken without grad over the actor's own micro-batches, with the actor's pass
(PolicyWithLogprobs: each group's prompt once), in the update phase.

It is held as the actor's weights are (`place`): under ZeRO-3 partitioned over the ranks by a
DeepSpeed engine without an optimizer (each rank keeps 1/world of it and gathers a layer for its
forward), below stage 3 a full copy on every rank in the model's dtype (0.54 GB for SmolLM2-135M
in fp32); the memory plan counts it either way.
"""

import copy

import torch
from torch import Tensor
from transformers import PreTrainedModel

from sparrow.rl.actor_config import ActorConfig
from sparrow.rl.policy_logprobs import PolicyWithLogprobs


class AdapterOffReference:
    """The KL reference of a LoRA run: the actor's forward with its adapter disabled (the frozen
    base is the run's initial policy, since the adapter starts at B = 0)."""

    def __init__(self, actor, cfg: ActorConfig):
        self.actor = actor
        self.share_prompts = cfg.share_prompts

    @torch.no_grad()
    def token_logprobs(self, micro_batch: dict[str, Tensor], temperature: float) -> Tensor:
        """(b, T) fp32 log-probs of the micro-batch's tokens under the base policy."""
        groups = None
        if self.share_prompts and "prompt_lens" in micro_batch and "group_ids" in micro_batch:
            groups = (micro_batch["prompt_lens"], micro_batch["group_ids"])
        ids, mask = micro_batch["input_ids"], micro_batch["attention_mask"]
        return self.actor.base_token_logprobs(ids, mask, temperature, groups)


class ReferencePolicy:
    def __init__(self, model: PreTrainedModel, cfg: ActorConfig):
        frozen = copy.deepcopy(model).eval().requires_grad_(False)
        self.policy = PolicyWithLogprobs(frozen, cfg.logprob_chunk_tokens, cfg.share_prefix)
        self.share_prompts = cfg.share_prompts

    def place(self, actor) -> "ReferencePolicy":
        """On the actor's device, partitioned like the actor's weights (actor.partition_frozen)."""
        self.policy.to(next(actor.model.parameters()).device)
        self.policy = actor.partition_frozen(self.policy)
        return self

    @torch.no_grad()
    def token_logprobs(self, micro_batch: dict[str, Tensor], temperature: float) -> Tensor:
        """(b, T) fp32 log-probs of the micro-batch's tokens (0 at t = 0 and on padding)."""
        device = next(self.policy.parameters()).device
        mb = {k: v.to(device) for k, v in micro_batch.items()}
        groups: tuple[Tensor, ...] = ()
        if self.share_prompts and "prompt_lens" in mb and "group_ids" in mb:
            groups = (mb["prompt_lens"], mb["group_ids"])
        scores = self.policy(mb["input_ids"], mb["attention_mask"], 0, temperature, *groups)
        return scores[0]
