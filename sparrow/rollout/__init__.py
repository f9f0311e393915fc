"""sparrow's inference engine for RL rollouts (nano-vllm's split by noun).

    sequence.py       per-request state              (torch-free)
    block_manager.py  KV page pool, ref counts       (torch-free)
    scheduler.py      queues, batches, preemption    (torch-free)
    rope.py, model.py, linear.py   Llama/Qwen3 forward on the engine's copy of HF weights
    paged_attention.py             paged KV cache, dense/sparse decode attention
    dense_kv.py       the dense layers' contiguous K/V copy, appended to across steps
    lora.py           an unmerged LoRA applied on the decode rows a gate selects (DistillSparse)
    decode_plan.py    persistent decode metadata, updated by what changed; shape buckets
    cuda_graph.py     decode forward captured and replayed per step shape
    model_runner.py   sequences -> tensors -> logits
    sampler.py        temperature / top-k / top-p, log-probs, top-K
    outputs.py        GenerationOutput, per-token records, GenerateStats
    engine.py         LLMEngine, EngineConfig, SamplingParams: the step loop
    sleep.py          the engine asleep while the actor trains: pool (and weights) freed, re-made
    episodes.py       multi-turn episodes: one sequence per episode, observations as K/V chunks
    speculative.py    lossless sparse rollouts: the accept/resample rule (sparse drafts, dense p)
    speculative_round.py  one draft-and-verify round of generate over a decode batch
    weight_push.py    the policy's weights from a training rank to rollout ranks, in buckets

Nothing is imported here, so the scheduling modules stay importable without torch.
"""
