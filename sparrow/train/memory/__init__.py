"""A run's memory, sized before any large allocation.

plan.py            bytes per phase (weights, optimizer, engine pool, prefill, decode, actor)
actor_passes.py    the actor's and the exact acceptance's largest micro-batch, a no-grad pass
adapter.py         DistillSparse's adapter in the plan: its frozen base copy, LoRA, optimizer
fit.py             the plan against the device: size checkpointing/token budget, or refuse
offload.py         ZeRO-Offload in the plan: what moves to host RAM, the host RAM there is
context_budget.py  the tokens a prompt may take (KV pool, position limit) and the knob to name
run_inputs.py      a run's prompts, then the memory plan they size
peaks.py           what a step's phases really held (RSS high-water mark, or CUDA's), per phase
"""
