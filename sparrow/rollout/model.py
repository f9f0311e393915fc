"""Sparrow's forward pass for the families of sparrow.models.families (Llama, Mistral, Qwen2,
Qwen3), on weights copied from an HF model.

RMSNorm, RoPE (rope.py), GQA attention with Qwen3's per-head q/k RMSNorm and the q/k/v (Qwen2)
and o biases a config has, SwiGLU MLP, tied or separate LM head. Single-device and batch-flat:
prefill takes the concatenated tokens of several prompts (N, hidden) and runs dense causal
attention per prompt; decode takes one token per sequence (B, hidden) and attends through the
paged KV cache (paged_attention.py). The q/k/v and
gate/up projections are fused into one matrix each (fewer, larger matmuls). Weights are the
engine's own copy, so `load_state_dict` can refresh them in place from any HF-named state dict
(the trainer's, or base + merged LoRA) without touching the KV cache. An unmerged LoRA
(`set_lora`, lora.py) adds its delta only on the decode rows a gate selects; the policy's LoRA
(`set_policy_lora`, LoRA RL) adds its own on every row of every forward.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sparrow.kernels import add_rms_norm, qk_norm_rope, silu_mul
from sparrow.models.families import check_family
from sparrow.models.shape import ModelShape
from sparrow.rollout.linear import Linear
from sparrow.rollout.lora import LayerLora, LowRankDelta, build_layer_loras, copy_layer_loras
from sparrow.rollout.paged_attention import (
    DecodeMetadata,
    PagedKVCache,
    PrefillMetadata,
    VerifyMetadata,
)
from sparrow.rollout.rope import Rope, apply_rope, rope_from_config

# Prefixes that wrappers put in front of HF parameter names (PEFT, DDP).
_NAME_PREFIXES = ("base_model.model.", "module.")


def hf_weight_name(raw_name: str) -> str | None:
    """The HF parameter name under the prefixes wrappers add (PEFT, DDP); None for buffers
    that are not weights (rotary inverse frequencies)."""
    name = raw_name
    for prefix in _NAME_PREFIXES:
        name = name.removeprefix(prefix)
    return None if name.endswith("rotary_emb.inv_freq") else name


@dataclass
class LayerWeights:
    input_norm: Tensor  # (hidden,)
    qkv: Tensor  # ((H_q + 2 H_kv) D, hidden): q, k, v projections stacked
    qkv_bias: Tensor | None  # ((H_q + 2 H_kv) D,) when the family has q/k/v biases
    qk_norm: Tensor | None  # (H_q + H_kv, D) Qwen3 only: q_norm per query head, then k_norm
    o: Tensor  # (hidden, H_q D)
    o_bias: Tensor | None  # (hidden,) when it has an o bias
    post_norm: Tensor  # (hidden,)
    gate_up: Tensor  # (2 I, hidden): gate and up projections stacked
    down: Tensor  # (hidden, I)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """As transformers does it: normalise in fp32, cast back, then scale. In fp32 that is torch's
    fused rms_norm (same values, one op instead of six: decode is dispatch-bound at small batch)."""
    if x.dtype == weight.dtype == torch.float32 and weight.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class DecoderModel:
    def __init__(
        self,
        config,
        state_dict: Mapping[str, Tensor],
        dtype: torch.dtype,
        device,
        linear: Linear | None = None,
        triton_kernels: bool | None = None,
    ):
        """`triton_kernels`: run the fused Triton kernels below (the runner passes whether its
        attention backend runs Triton; None: on CUDA). A config of a family sparrow does not run
        is refused in one line (LLMEngine also checks a sliding window against its context)."""
        check_family(config)
        s = self.shape = ModelShape.from_hf_config(config)
        self.linear = linear or Linear("torch", batch_hint=1)
        self.rope: Rope = rope_from_config(config, s.head_dim)
        self.rope.inv_freq = self.rope.inv_freq.to(device)
        self.dtype = dtype
        # With the Triton backend (CUDA, or the interpreter in tests and `sparrow-bench decode`):
        # in bf16/fp16 RMSNorm (+ residual add) and q/k norm + RoPE (norm_rope_triton.py), in
        # every dtype SwiGLU's silu * up (swiglu_triton.py), as one launch each with the torch
        # path's rounding; elsewhere (the CPU path) the torch ops.
        if triton_kernels is None:
            triton_kernels = torch.device(device).type == "cuda"
        self.fused_norm_rope = triton_kernels and dtype in (torch.bfloat16, torch.float16)
        self.fused_silu_mul = triton_kernels

        def new(*shape: int) -> Tensor:
            return torch.empty(shape, dtype=dtype, device=device)

        qkv_rows = (s.num_q_heads + 2 * s.num_kv_heads) * s.head_dim
        self.embed = new(s.vocab_size, s.hidden_size)
        self.final_norm = new(s.hidden_size)
        self.lm_head = self.embed if s.tied_embeddings else new(s.vocab_size, s.hidden_size)
        self.layers = [
            LayerWeights(
                input_norm=new(s.hidden_size),
                qkv=new(qkv_rows, s.hidden_size),
                qkv_bias=new(qkv_rows) if s.qkv_bias else None,
                qk_norm=new(s.num_q_heads + s.num_kv_heads, s.head_dim) if s.qk_norm else None,
                o=new(s.hidden_size, s.num_q_heads * s.head_dim),
                o_bias=new(s.hidden_size) if s.o_bias else None,
                post_norm=new(s.hidden_size),
                gate_up=new(2 * s.intermediate_size, s.hidden_size),
                down=new(s.hidden_size, s.intermediate_size),
            )
            for _ in range(s.num_layers)
        ]
        self._targets = self._parameter_views()
        self.lora: list[LayerLora] | None = None  # per layer; None: no adapter, no extra ops
        self.policy_lora: list[LayerLora] | None = None  # LoRA RL's, at every row; per layer
        loaded = self.load_state_dict(state_dict)
        missing = set(self._targets) - loaded - {"lm_head.weight"}
        if missing:
            raise KeyError(f"state dict lacks {len(missing)} weights, e.g. {sorted(missing)[:3]}")

    def missing_weights(self, loaded: set[str]) -> set[str]:
        """The weights a load of the names `loaded` left unset (a tied LM head is the embedding)."""
        tied = {"lm_head.weight"} if self.shape.tied_embeddings else set()
        return set(self._targets) - loaded - tied

    def weight_tensors(self) -> list[Tensor]:
        """Every weight (views of the fused ones included), for the engine's sleep to free."""
        return list(self._targets.values())

    def _parameter_views(self) -> dict[str, Tensor]:
        """HF parameter name -> the slice of sparrow's (fused) weight that holds it."""
        s = self.shape
        q_rows, kv_rows = s.num_q_heads * s.head_dim, s.num_kv_heads * s.head_dim
        splits = {"q_proj": (0, q_rows), "k_proj": (q_rows, kv_rows)}
        splits["v_proj"] = (q_rows + kv_rows, kv_rows)
        views = {
            "model.embed_tokens.weight": self.embed,
            "model.norm.weight": self.final_norm,
            "lm_head.weight": self.lm_head,
        }
        inter = s.intermediate_size
        for i, w in enumerate(self.layers):
            p = f"model.layers.{i}."
            views[p + "input_layernorm.weight"] = w.input_norm
            views[p + "post_attention_layernorm.weight"] = w.post_norm
            for name, (start, rows) in splits.items():
                views[p + f"self_attn.{name}.weight"] = w.qkv[start : start + rows]
                if w.qkv_bias is not None:
                    views[p + f"self_attn.{name}.bias"] = w.qkv_bias[start : start + rows]
            views[p + "self_attn.o_proj.weight"] = w.o
            if w.o_bias is not None:
                views[p + "self_attn.o_proj.bias"] = w.o_bias
            if w.qk_norm is not None:
                # Stored per head so that q and k are normalised (and rotated) in one op each.
                views[p + "self_attn.q_norm.weight"] = w.qk_norm[: s.num_q_heads]
                views[p + "self_attn.k_norm.weight"] = w.qk_norm[s.num_q_heads :]
            views[p + "mlp.gate_proj.weight"] = w.gate_up[:inter]
            views[p + "mlp.up_proj.weight"] = w.gate_up[inter:]
            views[p + "mlp.down_proj.weight"] = w.down
        return views

    @torch.inference_mode()
    def load_state_dict(self, state_dict: Mapping[str, Tensor], repack: bool = True) -> set[str]:
        """Copy HF-named weights in place (any subset); returns the names loaded. `repack=False`
        leaves the linear backend's packed copies stale: call `repack` after the last load."""
        loaded = set()
        for raw_name, tensor in state_dict.items():
            name = hf_weight_name(raw_name)
            if name is None:
                continue
            if name not in self._targets:
                hint = (
                    " (merge LoRA adapters into the base weights first)" if "lora_" in name else ""
                )
                raise KeyError(f"unexpected weight {raw_name!r}{hint}")
            target = self._targets[name]
            per_head = name.endswith(("q_norm.weight", "k_norm.weight"))
            expected = target.shape[1:] if per_head else target.shape
            if tuple(tensor.shape) != tuple(expected):
                raise ValueError(f"{raw_name}: shape {tuple(tensor.shape)} != {tuple(expected)}")
            target.copy_(tensor.expand_as(target))
            loaded.add(name)
        if repack:
            self.repack()
        return loaded

    def repack(self) -> None:
        """Rebuild the linear backend's packed weights from the current values."""
        self.linear.repack(self._matrices())

    def set_lora(self, factors: Mapping[str, tuple[Tensor, Tensor]] | None) -> None:
        """Unmerged LoRA: HF module name -> (A (r, in), B scaled (out, r)), copied; None removes
        it. Kept across `load_state_dict`; applied only where `decode` gets a gate."""
        if factors is None:
            self.lora = None
            return
        # A name that is no weight stays as given, for the unknown-name error.
        named = {hf_weight_name(name) or name: pair for name, pair in factors.items()}
        self.lora = build_layer_loras(named, self._targets, self.shape.num_layers)

    def set_policy_lora(self, factors: Mapping[str, tuple[Tensor, Tensor]] | None) -> bool:
        """The policy's LoRA (LoRA RL): as `set_lora`'s factors, applied at every row of every
        forward. Copied into the current factors' tensors when their shapes match (a captured
        graph stays valid); True when the set of ops changed instead (graphs must be redone)."""
        if factors is None:
            changed, self.policy_lora = self.policy_lora is not None, None
            return changed
        named = {hf_weight_name(name) or name: pair for name, pair in factors.items()}
        loras = build_layer_loras(named, self._targets, self.shape.num_layers)
        if self.policy_lora is not None and copy_layer_loras(self.policy_lora, loras):
            return False
        self.policy_lora = loras
        return True

    def _matrices(self) -> list[Tensor]:
        mats = [self.lm_head]
        for w in self.layers:
            mats += [w.qkv, w.o, w.gate_up, w.down]
        return mats

    def prefill(
        self,
        input_ids: Tensor,
        positions: Tensor,
        seq_bounds: list[tuple[int, int]],
        last_rows: Tensor,
        kv: PagedKVCache,
        meta: PrefillMetadata,
    ) -> Tensor:
        """input_ids, positions (N,) of concatenated prompts -> logits (G, V) fp32 at last_rows.
        A group with context slots in `meta` (its first C tokens, cached) holds only its tokens
        C.. here (positions C..), which attend to the cached K/V of the first C, then causally to
        their own."""
        scale = self.shape.head_dim**-0.5
        contexts = meta.context_slots or [None] * len(seq_bounds)

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            kv.write_prefill(layer, k, v, meta)
            outs = []
            for (start, end), context in zip(seq_bounds, contexts, strict=True):
                ks, vs, mask = k[start:end], v[start:end], None  # (L, H_kv, D)
                if context is not None:
                    k_ctx, v_ctx = kv.read_slots(layer, context)  # (C, H_kv, D) each
                    ks, vs = torch.cat([k_ctx, ks]), torch.cat([v_ctx, vs])  # (C + L, H_kv, D)
                    mask = _causal_after(end - start, context.numel(), q.device)  # (L, C + L)
                o = F.scaled_dot_product_attention(
                    q[start:end].transpose(0, 1)[None],  # (1, H_q, L, D)
                    ks.transpose(0, 1)[None],  # (1, H_kv, C + L, D)
                    vs.transpose(0, 1)[None],
                    attn_mask=mask,
                    is_causal=mask is None,
                    scale=scale,
                    enable_gqa=True,
                )  # (1, H_q, L, D)
                outs.append(o[0].transpose(0, 1))  # (L, H_q, D)
            return torch.cat(outs) if len(outs) > 1 else outs[0]  # (N, H_q, D)

        hidden = self._forward(input_ids, positions, attend)  # (N, hidden)
        return self._logits(hidden[last_rows])

    def decode(
        self,
        input_ids: Tensor,
        positions: Tensor,
        kv: PagedKVCache,
        meta: DecodeMetadata,
        lora_gate: Tensor | None = None,
    ) -> Tensor:
        """One token per sequence: input_ids, positions (B,) -> logits (B, V) fp32.
        lora_gate (B,) 0/1 in the model dtype: rows whose whole forward adds the LoRA delta."""

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return kv.decode_attention(layer, q, k, v, meta)

        return self._logits(self._forward(input_ids, positions, attend, lora_gate))

    def verify(
        self,
        input_ids: Tensor,
        positions: Tensor,
        logit_rows: Tensor | None,
        kv: PagedKVCache,
        meta: VerifyMetadata,
    ) -> Tensor:
        """Several tokens per sequence onto its cached K/V (speculative decoding's dense pass):
        input_ids, positions (N,) -> logits (N, V) fp32, or at `logit_rows` only (R,)."""

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return kv.verify_attention(layer, q, k, v, meta)

        hidden = self._forward(input_ids, positions, attend)  # (N, hidden)
        return self._logits(hidden if logit_rows is None else hidden[logit_rows])

    def _forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        attend: Callable[[int, Tensor, Tensor, Tensor], Tensor],
        lora_gate: Tensor | None = None,
    ) -> Tensor:
        s = self.shape
        lora = self.lora if lora_gate is not None else None
        n = input_ids.shape[0]
        num_qk_heads = s.num_q_heads + s.num_kv_heads
        cos, sin = self.rope.cos_sin(positions, self.dtype)  # (N, 1, D) each
        x = F.embedding(input_ids, self.embed)  # (N, hidden)
        mlp_out = None  # the previous layer's MLP output, added to x by the next norm
        for i, w in enumerate(self.layers):
            d = None if lora is None else lora[i]
            p = None if self.policy_lora is None else self.policy_lora[i]
            x, h = self._add_norm(x, mlp_out, w.input_norm)
            qkv = self._project(
                h, w.qkv, w.qkv_bias, d.qkv if d else None, lora_gate, p.qkv if p else None
            )
            qkv = qkv.view(n, -1, s.head_dim)  # (N, H_q + 2 H_kv, D)
            qk, v = qkv[:, :num_qk_heads], qkv[:, num_qk_heads:]  # (N, H_q + H_kv, D), (N, H_kv, D)
            qk = self._qk_norm_rope(qk, w.qk_norm, cos, sin)  # q and k heads together
            q, k = qk[:, : s.num_q_heads], qk[:, s.num_q_heads :]  # (N, H_q, D), (N, H_kv, D)
            o = attend(i, q, k, v)  # (N, H_q, D)
            attn_out = self._project(
                o.reshape(n, -1), w.o, w.o_bias, d.o if d else None, lora_gate, p.o if p else None
            )
            x, h = self._add_norm(x, attn_out, w.post_norm)
            gate_up = self._project(
                h, w.gate_up, None, d.gate_up if d else None, lora_gate, p.gate_up if p else None
            )  # (N, 2 I)
            mlp_out = self._project(
                self._swiglu(gate_up),
                w.down,
                None,
                d.down if d else None,
                lora_gate,
                p.down if p else None,
            )
        assert mlp_out is not None, "a model has at least one layer"
        return x + mlp_out

    def _add_norm(
        self, x: Tensor, residual: Tensor | None, weight: Tensor
    ) -> tuple[Tensor, Tensor]:
        """(x + residual, its RMSNorm) for (N, hidden) rows; residual None: nothing to add."""
        eps = self.shape.rms_eps
        if self.fused_norm_rope:
            return add_rms_norm(x, weight, eps, residual)
        x = x if residual is None else x + residual
        return x, rms_norm(x, weight, eps)

    def _swiglu(self, gate_up: Tensor) -> Tensor:
        """silu(gate) * up (N, I) of the fused gate/up projection (N, 2 I)."""
        if self.fused_silu_mul:
            return silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)  # (N, I) each
        return F.silu(gate) * up

    def _qk_norm_rope(self, qk: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor) -> Tensor:
        """Qwen3's per-head RMSNorm (weight (H, D); None: Llama, no norm), then RoPE."""
        if self.fused_norm_rope:
            return qk_norm_rope(qk, weight, cos, sin, self.shape.rms_eps)
        if weight is not None:
            qk = rms_norm(qk, weight, self.shape.rms_eps)
        return apply_rope(qk, cos, sin)

    def _project(
        self,
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        delta: LowRankDelta | None,
        gate: Tensor | None,
        policy: LowRankDelta | None = None,
    ) -> Tensor:
        """x (N, in) -> (N, out): x W^T + b, plus the policy's LoRA delta on every row and the
        gated LoRA delta on the gated rows (the two deltas add)."""
        y = self.linear(x, weight, bias)
        if policy is not None:
            y = y + policy(x)
        if delta is None:
            return y
        assert gate is not None, "a LoRA delta applies only where decode gets a gate"
        return y + delta(x, gate)

    def _logits(self, hidden: Tensor) -> Tensor:
        hidden = self._add_norm(hidden, None, self.final_norm)[1]
        return self.linear(hidden, self.lm_head).float()  # (B, V)


def _causal_after(num_new: int, num_context: int, device) -> Tensor:
    """(num_new, num_context + num_new) bool: new token i sees the whole context and new tokens
    0..i (SDPA's is_causal aligns the diagonal top-left, wrong when keys outnumber queries)."""
    mask = torch.ones(num_new, num_context + num_new, dtype=torch.bool, device=device)
    return mask.tril(diagonal=num_context)
