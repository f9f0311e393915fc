"""The measured decode speedup: the step's prompts rolled out again densely, timed, so the
dashboard shows it beside the cost model's prediction (every `monitor.speedup_every` steps)."""


def measure_speedup(
    engine, prompts: list[list[int]], sampling, group_size: int, sparse_stats, seed: int
):
    """Decode tok/s of the sparse rollout (`sparse_stats`, the engine's last stats) over a dense
    re-rollout of the same `prompts`, sampled from `seed` (a stream of its own, so that the
    probe leaves the training rollouts' samples as they were); the engine's schedule is restored
    afterwards. With speculative rollouts the dense arm is plain dense decode too (a round
    drafting densely would time a verify pass per token for nothing)."""
    schedule, speculative = engine.schedule, engine.speculative
    engine.set_schedule(None)
    engine.speculative = None
    try:
        engine.generate(prompts, sampling, group_size, seed=seed)
    finally:
        engine.set_schedule(schedule)
        engine.speculative = speculative
    dense_stats = engine.last_stats
    return {
        "speedup/measured": sparse_stats.decode_tok_s / max(dense_stats.decode_tok_s, 1e-9),
        "speedup/dense_decode_tok_s": dense_stats.decode_tok_s,
        "speedup/sparse_decode_tok_s": sparse_stats.decode_tok_s,
    }
