"""DistillSparse (docs/DESIGN.md §1): a LoRA adapter used only by the sparse rollout policy, trained
after each dense update towards the dense policy's log-probs (plus the sparse GRPO term).

- sparse_attention.py: the training-time sparse attention hooked into the HF model
- page_selection.py: the engine's page selection for a chunk of teacher-forced queries
- page_gather_attention.py: per-chunk page gathering, recomputed in backward: O(T x budget)
- attention_reference.py: the masked O(T^2) form, kept as the tests' and benchmark's reference
- sparse_policy.py: frozen base copy + peft LoRA; sparse log-probs, merged weights for the engine
- loss.py: L = pg_coef * L_GRPO,sparse + lambda * k3(logp_dense_old - logp_sparse)
- distill_sparse.py: `DistillConfig` and `DistillSparse` (optimizer, step, checkpoint state)
"""

from sparrow.distill.distill_sparse import DistillConfig, DistillSparse

__all__ = ["DistillConfig", "DistillSparse"]
