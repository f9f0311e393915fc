"""DistillSparse (docs/DESIGN.md §1): a LoRA adapter used only by the sparse rollout policy, trained
after each dense update towards the dense policy's log-probs (plus the sparse GRPO term).

- sparse_attention.py: the engine's page selection as a differentiable training-time mask
- sparse_policy.py: frozen base copy + peft LoRA; sparse log-probs, merged weights for the engine
- loss.py: L = pg_coef * L_GRPO,sparse + lambda * k3(logp_dense_old - logp_sparse)
- distill_sparse.py: `DistillConfig` and `DistillSparse` (optimizer, step, checkpoint state)
"""

from sparrow.distill.distill_sparse import DistillConfig, DistillSparse

__all__ = ["DistillConfig", "DistillSparse"]
