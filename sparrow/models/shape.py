"""The decoder's shape, read once from a Hugging Face config of a family in families.py: the engine
sizes its weights and KV cache from it, the cost model prices a decode step with it, the memory
plan counts parameters and the actor's activations with it, and the benches describe the models
they time.

    shape = ModelShape.from_hf_config(model.config)

Attributes are read, nothing is imported from transformers, so any object with the config's
attribute names works (the benches pass hand-made ones).
"""

from dataclasses import dataclass

from sparrow.models.families import FAMILIES, attention_biases


@dataclass(frozen=True)
class ModelShape:
    num_layers: int  # transformer blocks
    hidden_size: int  # model width
    intermediate_size: int  # gated MLP width (gate, up and down matrices)
    num_q_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA)
    head_dim: int  # per-head width
    vocab_size: int  # embedding and LM-head rows
    rms_eps: float = 1e-6  # RMSNorm epsilon
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before RoPE
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2; attention_bias)
    o_bias: bool = False  # a bias on the output projection (attention_bias)
    tied_embeddings: bool = False  # the LM head is the embedding matrix

    @classmethod
    def from_hf_config(cls, config) -> "ModelShape":
        heads = config.num_attention_heads
        qkv_bias, o_bias = attention_biases(config)
        family = FAMILIES.get(getattr(config, "model_type", ""))
        return cls(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_q_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            vocab_size=config.vocab_size,
            rms_eps=getattr(config, "rms_norm_eps", 1e-6),
            qk_norm=family is not None and family.qk_norm,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )

    @property
    def kv_dim(self) -> int:
        """Width of one token's keys (or values) in one layer: num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim
