"""The DistillSparse loss on the sparse policy's log-probs of rollout tokens (DESIGN.md §1).

    L = pg_coef * L_GRPO,sparse + lambda * k3(logp_dense_old - logp_sparse)

L_GRPO,sparse is sparrow's GRPO term with the same advantages and the on-policy ratio
r = exp(logp_sparse - logp_sparse.detach()) (value 1, so PPO clipping never binds and no TIS
weight applies: the tokens were sampled by the sparse policy). k3(d) = exp(d) - d - 1 with
d = logp_dense_old - logp_sparse is Schulman's estimator of KL(sparse || dense) on tokens drawn
from the sparse policy; the Sparrow code uses lambda = 1e-3. Both terms are token means with the
step's global normaliser (sparrow.rl.losses.global_token_mean), so the split into micro-batches
does not change the gradient.
"""

import torch
from torch import Tensor

from sparrow.rl.losses import global_token_mean, kl_k3


def distill_loss(
    sparse_logprobs: Tensor,
    dense_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    global_num_tokens: float | Tensor,
    *,
    pg_coef: float,
    lambda_k3: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of one micro-batch and its detached metrics (already divided by the global count,
    so they add up over micro-batches).

    Args:
        sparse_logprobs: (B, T) sparse policy (base + adapter) log-probs of the tokens, with grad.
        dense_logprobs: (B, T) dense policy log-probs before this step's update (no grad).
        advantages: (B, T) per-token GRPO advantages. loss_mask: (B, T) bool, completion tokens.
        global_num_tokens: completion tokens of the whole step.
    """
    ratio = torch.exp(sparse_logprobs - sparse_logprobs.detach())  # (B, T) == 1, carries grad
    pg = global_token_mean(-advantages * ratio, loss_mask, global_num_tokens)
    k3 = global_token_mean(
        kl_k3(sparse_logprobs, dense_logprobs.detach()), loss_mask, global_num_tokens
    )
    loss = pg_coef * pg + lambda_k3 * k3
    with torch.no_grad():
        gap = global_token_mean(dense_logprobs - sparse_logprobs, loss_mask, global_num_tokens)
    return loss, {"loss": loss.detach(), "pg_loss": pg.detach(), "k3": k3.detach(), "logp_gap": gap}
