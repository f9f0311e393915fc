"""The activation estimate the plan line states per actor micro-batch."""

from transformers import Qwen3Config

from sparrow.rl.actor_memory import DecoderShape, micro_batch_activation_bytes
from sparrow.train.step_report import actor_plan

QWEN3_1P7B = Qwen3Config(
    hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, vocab_size=151936,
)  # fmt: skip


def test_estimate_scales_with_tokens_and_checkpointing_cuts_it():
    shape = DecoderShape.from_hf(QWEN3_1P7B)
    assert shape.kv_dim == 8 * 128 and shape.layers == 28

    def gib(tokens, ckpt):
        return micro_batch_activation_bytes(shape, tokens, ckpt, 1024) / 2**30

    # Linear in tokens past the fixed logits chunk.
    assert gib(65536, True) - gib(32768, True) == gib(32768, True) - gib(0, True)
    # A group of 8 x 16K tokens whole, without checkpointing, cannot fit one H200 (141 GB) ...
    assert gib(8 * 16384, False) > 141
    # ... a 32K-token micro-batch with checkpointing leaves room for weights and AdamW states.
    assert 5 < gib(32768, True) < 30


def test_plan_line_states_the_micro_batch_and_its_estimate():
    from sparrow.cli.config_loader import load_config

    cfg = load_config(["preset=qwen3_1p7b_gpu"])
    line = actor_plan(cfg, QWEN3_1P7B)
    assert "<= 32768 tokens (token budget)" in line and "checkpointing on" in line
    assert "GiB each" in line
