"""ModelShape read from an HF config: head_dim and KV heads derived where the config omits them."""

from types import SimpleNamespace

from sparrow.models.loading import tiny_model_config
from sparrow.models.shape import ModelShape


def test_shape_from_hf_config():
    hf = SimpleNamespace(
        num_hidden_layers=30,
        hidden_size=576,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
    )
    s = ModelShape.from_hf_config(hf)
    assert (s.head_dim, s.num_kv_heads, s.kv_dim, s.num_layers) == (64, 3, 192, 30)
    assert not (s.qk_norm or s.tied_embeddings or s.qkv_bias or s.o_bias)
    del hf.num_key_value_heads  # multi-head attention: as many KV heads as query heads
    assert ModelShape.from_hf_config(hf).num_kv_heads == 9


def test_shape_of_the_tiny_qwen3():
    s = ModelShape.from_hf_config(tiny_model_config("qwen3"))
    assert (s.num_q_heads, s.num_kv_heads, s.head_dim, s.hidden_size) == (4, 2, 16, 64)
    assert s.qk_norm and s.tied_embeddings and s.rms_eps == 1e-6
