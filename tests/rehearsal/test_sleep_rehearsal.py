"""The engine's sleep/wake cycle on a fake CUDA device at Qwen3-1.7B / 32K with CUDA graphs on
(the GPU preset as the 80 GB fit sizes it, rollout.engine.sleep=kv): a rollout captures its
decode graph, sleep frees the pool and page summaries (the device's live bytes fall by them,
the pool's tensors are dead), wake re-allocates them with no fault, and the next rollout
captures its graph again and replays it (the old graph, which points at the freed pool, is
never replayed)."""

import weakref
from dataclasses import replace

from harness import ENGINE_PHASES, ENGINE_READS, PRESET, fake_gpu, qwen3_model
from test_engine_rehearsal import GIB, KV_BYTES, SUMMARY_BYTES

from sparrow.cli.config_loader import load_config
from sparrow.control.controller import make_controller
from sparrow.models.loading import tiny_tokenizer
from sparrow.rollout.engine import LLMEngine, SamplingParams

MAX_TOKENS = 3


def test_sleep_and_wake_on_a_fake_gpu_with_graphs():
    cfg = load_config([*PRESET, "memory.device_gib=80"])
    eng = replace(cfg.rollout.engine, cuda_graphs=True, sleep="kv")
    with fake_gpu(phases=ENGINE_PHASES, host_reads_at=ENGINE_READS) as h:
        model = qwen3_model(cfg, "cuda")
        engine = LLMEngine(model, tiny_tokenizer(), eng)
        engine.set_schedule(make_controller(cfg.schedule, cfg.controller).schedule.budget_pages)
        prefix = [3 + (i * 7919) % (model.config.vocab_size - 3) for i in range(32768 - 60)]
        prompts = [prefix + [3 + p] * 60 for p in range(2)]
        params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True)

        first = engine.generate(prompts, params, n=8)
        graphs = engine.runner.graphs
        assert (graphs.num_captured, graphs.num_replayed) == (1, MAX_TOKENS - 1)
        pool = weakref.ref(engine.runner.kv.k)
        awake = h.live.live["cuda"]

        engine.sleep(eng.sleep)  # what the trainer does before the actor's phases
        asleep = h.live.live["cuda"]
        assert pool() is None and engine.runner.graphs is None
        freed = awake - asleep
        assert freed >= KV_BYTES + SUMMARY_BYTES, freed / GIB

        engine.wake()  # the sync's
        assert h.live.live["cuda"] - asleep == KV_BYTES + SUMMARY_BYTES
        second = engine.generate(prompts, params, n=8)
        again = engine.runner.graphs
        assert again is not graphs and graphs.num_replayed == MAX_TOKENS - 1  # old: never again
        assert (again.num_captured, again.num_replayed) == (1, MAX_TOKENS - 1)
        assert [o.token_ids for o in second] == [o.token_ids for o in first]
    print(f"\n[sleep rehearsal] GiB: awake {awake / GIB:.2f}, asleep {asleep / GIB:.2f}, "
          f"freed {freed / GIB:.2f} (pool {KV_BYTES / GIB:.2f} + summaries "
          f"{SUMMARY_BYTES / GIB:.2f} + the graphs' buffers)")  # fmt: skip
