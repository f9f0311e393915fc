"""The DistillSparse loss on the sparse policy's log-probs of rollout tokens (docs/DESIGN.md §1).

    L = pg_coef * L_GRPO,sparse + lambda * k3(logp_dense_old - logp_sparse)
        + lambda_kl * KL_K(dense_old || sparse)

L_GRPO,sparse is sparrow's GRPO term with the same advantages and the on-policy ratio
r = exp(logp_sparse - logp_sparse.detach()) (value 1, so PPO clipping never binds and no TIS
weight applies: the tokens were sampled by the sparse policy). k3(d) = exp(d) - d - 1 with
d = logp_dense_old - logp_sparse is Schulman's estimator of KL(sparse || dense) on tokens drawn
from the sparse policy; the Sparrow code uses lambda = 1e-3.

KL_K is an optional lower-variance term (sparrow's, not the paper's): the KL between the two
policies' distributions coarse-grained to the dense top-K tokens plus one "rest" bucket, from the
top-K the dense actor already returns with its log-probs. k3 sees one sampled token per position;
KL_K sees the K most likely ones, which is where the acceptance sum_v min(p, q) is decided.

All terms are token means with the step's global normaliser (sparrow.rl.losses.global_token_mean),
so the split into micro-batches does not change the gradient.
"""

import torch
from torch import Tensor

from sparrow.rl.losses import global_token_mean, kl_k3

REST_EPS = 1e-6  # floor on the rest bucket's mass: log(0) when the top-K holds all the mass


def kl_topk(dense_topk_logprobs: Tensor, sparse_topk_logprobs: Tensor) -> Tensor:
    """KL(p || q) between p and q restricted to K tokens plus the rest of the vocabulary.

    dense_topk_logprobs, sparse_topk_logprobs: (..., K) full-vocabulary log-probs of the same K
    token ids under the dense (p) and sparse (q) policies. Returns (...) >= 0; equal to the full
    KL when the K ids cover the vocabulary, a lower bound on it otherwise (coarse-graining).
    """
    p, q = dense_topk_logprobs.exp(), sparse_topk_logprobs.exp()  # (..., K)
    head = (p * (dense_topk_logprobs - sparse_topk_logprobs)).sum(-1)  # (...)
    p_rest = (1.0 - p.sum(-1)).clamp_min(0.0)  # (...)
    q_rest = (1.0 - q.sum(-1)).clamp_min(REST_EPS)  # (...)
    rest = p_rest * (torch.log(p_rest.clamp_min(REST_EPS)) - torch.log(q_rest))  # (...)
    return (head + rest).clamp_min(0.0)


def distill_loss(
    sparse_logprobs: Tensor,
    dense_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    global_num_tokens: float | Tensor,
    *,
    pg_coef: float,
    lambda_k3: float,
    lambda_kl: float = 0.0,
    dense_topk_logprobs: Tensor | None = None,
    sparse_topk_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of one micro-batch and its detached metrics (already divided by the global count,
    so they add up over micro-batches).

    Args:
        sparse_logprobs: (B, T) sparse policy (base + adapter) log-probs of the tokens, with grad.
        dense_logprobs: (B, T) dense policy log-probs before this step's update (no grad).
        advantages: (B, T) per-token GRPO advantages. loss_mask: (B, T) bool, completion tokens.
        global_num_tokens: completion tokens of the whole step.
        dense_topk_logprobs: (B, T, K) the dense policy's top-K log-probs (no grad), and
        sparse_topk_logprobs: (B, T, K) the sparse policy's log-probs of the same ids (with
        grad); both needed when lambda_kl > 0.
    """
    ratio = torch.exp(sparse_logprobs - sparse_logprobs.detach())  # (B, T) == 1, carries grad
    pg = global_token_mean(-advantages * ratio, loss_mask, global_num_tokens)
    k3 = global_token_mean(
        kl_k3(sparse_logprobs, dense_logprobs.detach()), loss_mask, global_num_tokens
    )
    loss = pg_coef * pg + lambda_k3 * k3
    metrics = {"pg_loss": pg.detach(), "k3": k3.detach()}
    if lambda_kl > 0:
        if dense_topk_logprobs is None or sparse_topk_logprobs is None:
            raise ValueError("lambda_kl > 0 needs the dense top-K log-probs and the sparse ones")
        kl = global_token_mean(
            kl_topk(dense_topk_logprobs.detach(), sparse_topk_logprobs),
            loss_mask,
            global_num_tokens,
        )
        loss = loss + lambda_kl * kl
        metrics["kl_topk"] = kl.detach()
    with torch.no_grad():
        gap = global_token_mean(dense_logprobs - sparse_logprobs, loss_mask, global_num_tokens)
    return loss, {"loss": loss.detach(), **metrics, "logp_gap": gap}
