"""The algorithm: the rollout batch, GRPO advantages and loss, and the dense actor.

batch.py                    RolloutBatch: the engine's outputs as padded (B, T) tensors
advantages.py               group-relative advantages
losses.py                   PPO clip (clip-higher, dual clip) x the rollout correction's weight,
                            loss aggregation modes, the KL-to-reference term
rollout_correction.py       rl.correction: tis, token_mask, seq_tis, seq_mask, none (peer formulas)
overlong.py                 DAPO's soft overlong penalty and overlong filtering
reference.py                the KL term's frozen reference policy (the initial weights)
policy_logprobs.py          LogprobOutput and the module DeepSpeed wraps: decoder + chunked LM
                            head, per row or group-shared
shared_prompt_passes.py     the group-shared passes: each group's prompt (and the common prefix)
                            run once into a KV cache, the completions on it
micro_batches.py            rows into micro-batches: by count or by a token budget
activation_checkpointing.py recompute the decoder layers in backward
actor_config.py             ActorConfig and the LR schedule (no DeepSpeed)
actor_memory.py             the activation estimate of the plan line, the row-expanded prompt K/V
deterministic_backward.py   torch's deterministic kernels around the update's backward (CPU)
actor.py                    DenseActor: DeepSpeed ZeRO (the only module importing it)
policy_adapter.py           LoRA RL of the policy: the peft adapter, its sync factors, its export
op_build.py                 one JIT build of a DeepSpeed op at a time; a killed build's lock cleared
"""
