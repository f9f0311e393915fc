"""Models by name; imports no other part of sparrow.

loading.py      ModelConfig, HF and embedded SmolLM2 loading, the tiny debug configs and
                tokenizer
families.py     the model families sparrow runs (llama, mistral, qwen2, qwen3), what each needs
                of a config, and the one-line refusal of the rest
shape.py        ModelShape: the decoder's shape from an HF config (engine, cost model, actor
                memory, benches)
model_config.py a model's HF config without its weights (disk, HF cache, or hf_configs/ for
                the Qwen3 sizes the presets name): what a dry run plans from
random_init.py  random-weight Qwen3-1.7B/4B/8B (and qwen3-debug) for GPU benchmarks
"""
