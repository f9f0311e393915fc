"""The sparse rollout policy as a trainable model: a frozen copy of the base weights plus a LoRA.

DistillSparse (docs/DESIGN.md §1) gives the sparse policy its own adapter phi on top of the dense
weights theta. This module owns that model: a deep copy of the HF policy (the dense actor never
sees the adapter), wrapped by peft with LoRA on every linear layer of the decoder, with the
training-time block-sparse attention (sparse_attention.py) as its attention function. It answers
five questions: the sparse log-probs of rollout tokens (with grad into the adapter only), phi for
the engine (merged into theta for `LLMEngine.update_weights`, or as factors for
`LLMEngine.set_lora`), taking a new theta from the dense actor, and the adapter's tensors for
checkpoints.

Gated mode (`gate=True`): phi acts only at sparse tokens, those whose query reads fewer pages than
its context holds (budget < ceil((t + 1) / PAGE)); every layer of such a position, the K/V it
writes included, uses W + s B A, every other position W. A forward hook on each LoRA B scales its
output by that per-position gate, which is exactly the engine's gated decode step for the token.

Gated, the prompt is theta's alone (dense attention, gate 0) and gets no gradient, so the token
prefix every row's prompt starts with (a system prompt, solved examples) can run once without grad
(`shared_prefix`) and the rows continue from its K/V: S + B (L - S) decoder tokens instead of
B L, the same log-probs and adapter gradient up to fp32 round-off. A GRPO group shares its whole
prompt: DistillSparse extends the batch's prefix to each micro-batch's own.
"""

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel

from sparrow.distill.sparse_attention import (
    SparseForwardMetadata,
    query_budgets,
    register_attention,
)
from sparrow.rl.shared_prompt_passes import cache_keyword, common_prefix_len
from sparrow.rollout.model import hf_weight_name
from sparrow.rollout.paged_attention import SparseAttentionConfig

ADAPTER = "default"  # peft's adapter name


@dataclass
class SharedPrefix:
    """The K/V of a token prefix every row's prompt starts with, computed once without grad."""

    length: int  # S tokens
    cache: DynamicCache  # batch 1, S positions in every layer
    tokens: Tensor  # (S,) the prefix's token ids

    def for_rows(self, rows: int) -> DynamicCache:
        """A cache holding the prefix for `rows` rows, for one forward to append to."""
        cache = copy.deepcopy(self.cache)
        cache.batch_repeat_interleave(rows)
        return cache


def _weight(linear: nn.Module) -> Tensor:
    """A linear's weight (a module's attributes are Tensor | Module to a type checker)."""
    weight = linear.weight
    assert isinstance(weight, Tensor)
    return weight


class SparsePolicy:
    def __init__(
        self,
        base_model,
        attn: SparseAttentionConfig,
        *,
        rank: int,
        alpha: float,
        dropout: float,
        target_modules: str | list[str],
        gate: bool = False,
    ):
        """gate: phi only at sparse tokens (see the module docstring); False: at every token."""
        model = copy.deepcopy(base_model)
        model.set_attn_implementation(register_attention())
        lora = LoraConfig(  # peft annotates lora_alpha int; a float scales as alpha / r too
            r=rank,
            lora_alpha=alpha,  # type: ignore[arg-type]
            lora_dropout=dropout,
            target_modules=target_modules,
        )
        self.peft_model = get_peft_model(model, lora)  # freezes every non-LoRA parameter
        # The HF model with LoRA layers injected (nn.Module attribute lookups are untyped).
        self.model = cast(PreTrainedModel, self.peft_model.base_model.model)
        # Train mode only matters for LoRA dropout: Llama/Qwen3 have no other dropout modules,
        # and the sparse attention ignores attention_dropout (the engine has none).
        self.model.train(dropout > 0)
        self.attn = attn
        # HF name of each base weight -> the live tensor (LoRA-wrapped layers keep theirs in
        # `base_layer`); tied weights appear under both names, as in the HF state dict.
        self._base: dict[str, Tensor] = {
            name.replace(".base_layer.", "."): tensor
            for name, tensor in self.model.state_dict(keep_vars=True).items()
            if ".lora_" not in name
        }
        self._lora: dict[str, LoraLayer] = {
            name: m for name, m in self.model.named_modules() if isinstance(m, LoraLayer)
        }
        self.gated = gate
        self._gate: Tensor | None = None  # (B, L, 1) during a gated forward
        if gate:
            for layer in self._lora.values():
                layer.lora_B[ADAPTER].register_forward_hook(self._gate_output)

    def _gate_output(self, module, args, output: Tensor) -> Tensor:
        """LoRA B's output (B, L, out) times the current gate; unchanged outside a gated forward."""
        return output if self._gate is None else output * self._gate

    @contextmanager
    def _gated(self, gate: Tensor | None) -> Iterator[None]:
        self._gate = gate
        try:
            yield
        finally:
            self._gate = None

    def parameters(self) -> list[Tensor]:
        """The adapter's trainable tensors (LoRA A and B of every wrapped layer)."""
        return [p for p in self.peft_model.parameters() if p.requires_grad]

    def token_logprobs(
        self,
        input_ids: Tensor,
        completion_mask: Tensor,
        budget_pages: Tensor,
        temperature: float,
        topk_ids: Tensor | None = None,
        prefix: SharedPrefix | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Sparse-policy log-probs of the completion tokens, aligned as in RolloutBatch.

        input_ids, completion_mask, budget_pages: (B, T) of a right-padded rollout batch;
        topk_ids: optional (B, T, K) token ids per position (the dense policy's top-K);
        prefix: the rows' common prompt prefix from `shared_prefix` (gated mode), whose
        positions are then not run again.
        Returns (B, T) fp32 log p(input_ids[:, t] | < t) at `temperature` on completion tokens,
        0 elsewhere, and (B, T, K) the log-probs of `topk_ids` at the same positions (None
        without topk_ids); both differentiable w.r.t. the adapter.
        """
        device = next(self.model.parameters()).device
        used_len = int(completion_mask.long().cumsum(1).argmax(1).max()) + 1  # drop padding
        ids = input_ids[:, :used_len].to(device)  # (B, L)
        mask = completion_mask[:, :used_len].to(device)  # (B, L)
        budget_pages = budget_pages[:, :used_len].to(device)  # (B, L)
        start = 0 if prefix is None else prefix.length
        hidden = self._hidden_states(ids, mask, budget_pages, prefix)  # (B, L - S, H)
        targets = mask[:, 1:]  # (B, L - 1): hidden at t - 1 predicts the token at t
        if bool(targets[:, :start].any()):
            raise ValueError("the shared prefix reaches into a completion")
        rows = hidden[:, :-1][targets[:, start:]]  # (N, H)
        logits = self.model.get_output_embeddings()(rows).float() / temperature  # (N, V)
        logprobs = F.log_softmax(logits, dim=-1)  # (N, V)
        picked = logprobs.gather(-1, ids[:, 1:][targets][:, None])  # (N, 1)
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)  # (B, T)
        full_mask = F.pad(targets, (1, input_ids.shape[1] - used_len))  # (B, T)
        token_lp = out.masked_scatter(full_mask, picked.squeeze(-1))
        if topk_ids is None:
            return token_lp, None
        ids_k = topk_ids.to(device)[full_mask].long()  # (N, K): the same positions, row-major
        topk_lp = logprobs.gather(-1, ids_k)  # (N, K)
        out_k = torch.zeros((*input_ids.shape, ids_k.shape[-1]), device=device)  # (B, T, K)
        return token_lp, out_k.masked_scatter(full_mask[..., None], topk_lp)

    def _hidden_states(
        self, ids: Tensor, mask: Tensor, budget_pages: Tensor, prefix: SharedPrefix | None
    ) -> Tensor:
        """(B, L - S, H) the decoder's last hidden states at positions S.. of `ids` (B, L) under
        sparse attention at the rollout's budgets, S the prefix's length (0 without one: its
        positions come from its cache), phi gated to the sparse positions in gated mode."""
        device, used_len = ids.device, ids.shape[1]
        budgets = query_budgets(budget_pages, mask, self.attn.page_size)
        # Padding reads only sink + recent pages: its outputs reach no real token (see
        # query_budgets); the gate keeps the rollout's own budgets.
        attention_budgets = query_budgets(
            budget_pages, mask, self.attn.page_size,
            padding_pages=self.attn.num_sink + self.attn.num_recent,
        )  # fmt: skip
        meta = SparseForwardMetadata(self.attn, attention_budgets)
        gate = self.sparse_positions(budgets)[..., None].float() if self.gated else None
        decoder, start, cached = self.model.get_decoder(), 0, {}
        if prefix is not None:  # positions 0 .. S-1 come from the prefix's cache
            start = prefix.length
            cached = {
                cache_keyword(decoder): prefix.for_rows(len(ids)),
                "position_ids": torch.arange(start, used_len, device=device).expand(len(ids), -1),
                "use_cache": True,
            }
            gate = None if gate is None else gate[:, start:]
        with self._gated(gate):  # (B, L - S, 1)
            return decoder(
                input_ids=ids[:, start:], sparrow_sparse=meta, **cached
            ).last_hidden_state  # (B, L - S, H)

    @torch.no_grad()
    def shared_prefix(
        self, input_ids: Tensor, prompt_lens: Tensor, start: SharedPrefix | None = None
    ) -> SharedPrefix | None:
        """The K/V of the longest token prefix all rows' prompts start with, leaving every row at
        least one prompt token (its query predicts the first completion token), run once under
        theta (gate 0, dense attention, as the prompt is in `token_logprobs`). None ungated (phi
        acts on prompts, which then need its gradient) or when no token is shared. `start`, a
        prefix these rows begin with (the whole batch's), is extended rather than run again.

        input_ids (B, T) right-padded rows, prompt_lens (B,)."""
        length = common_prefix_len(input_ids, prompt_lens)
        if not self.gated or length == 0:
            return None
        if start is not None and start.length == length:
            return start
        begin = 0 if start is None else start.length
        device = next(self.model.parameters()).device
        positions = torch.arange(length, device=device)  # (S,)
        dense = SparseForwardMetadata(self.attn, (positions // self.attn.page_size + 1)[None])
        decoder = self.model.get_decoder()
        cache = DynamicCache(config=self.model.config) if start is None else start.for_rows(1)
        with self._gated(torch.zeros(1, length - begin, 1, device=device)):
            decoder(
                input_ids=input_ids[:1, begin:length].to(device),
                sparrow_sparse=dense,
                position_ids=positions[None, begin:],
                use_cache=True,
                **{cache_keyword(decoder): cache},
            )
        if cache.get_seq_length() != length:
            raise RuntimeError(f"{type(decoder).__name__} did not fill the prefix's KV cache")
        return SharedPrefix(length, cache, input_ids[0, :length].clone())

    def sparse_positions(self, budgets: Tensor) -> Tensor:
        """(B, L) query budgets -> (B, L) bool: the query at t reads fewer pages than its
        context (t + 1 tokens) holds, as the engine's decode step for the token at t + 1."""
        positions = torch.arange(budgets.shape[1], device=budgets.device)  # (L,)
        return budgets < positions // self.attn.page_size + 1  # ceil((t + 1) / PAGE)

    @torch.no_grad()
    def lora_factors(self) -> dict[str, tuple[Tensor, Tensor]]:
        """phi for `LLMEngine.set_lora`: HF module name -> (A (r, in), s B (out, r)), B scaled
        by peft's alpha / r, detached."""
        return {
            name: (
                _weight(layer.lora_A[ADAPTER]).detach(),
                _weight(layer.lora_B[ADAPTER]).detach() * layer.scaling[ADAPTER],
            )
            for name, layer in self._lora.items()
        }

    @torch.no_grad()
    def merged_state_dict(self) -> dict[str, Tensor]:
        """HF-named weights of theta + phi: every base weight, LoRA layers merged (W + s B A).
        Unmerged entries alias the live base weights (the engine copies them)."""
        merged = {name: t.detach() for name, t in self._base.items()}
        for name, layer in self._lora.items():
            base = _weight(layer.get_base_layer())
            # Each LoRA layer type defines it; their base class LoraLayer does not declare it.
            delta = layer.get_delta_weight(ADAPTER).to(base.dtype)  # type: ignore[attr-defined]
            merged[f"{name}.weight"] = base.detach() + delta
        return merged

    @torch.no_grad()
    def load_base(self, state_dict: Mapping[str, Tensor]) -> None:
        """Copy new dense weights theta (HF names, any subset) into the frozen base; the adapter
        is kept. Unknown names raise, so a renamed weight cannot be silently skipped."""
        for raw_name, tensor in state_dict.items():
            name = hf_weight_name(raw_name)
            if name is None:
                continue
            target = self._base.get(name)
            if target is None:
                raise KeyError(f"load_base: unexpected weight {raw_name!r}")
            if target.shape != tensor.shape:
                raise ValueError(
                    f"load_base: {raw_name} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(target.shape)}"
                )
            target.copy_(tensor)

    def adapter_state_dict(self) -> dict[str, Tensor]:
        """The adapter's tensors by parameter name (copies, for checkpoints)."""
        return {
            name: p.detach().clone()
            for name, p in self.peft_model.named_parameters()
            if p.requires_grad
        }

    @torch.no_grad()
    def load_adapter_state_dict(self, state: Mapping[str, Tensor]) -> None:
        params = {n: p for n, p in self.peft_model.named_parameters() if p.requires_grad}
        if set(state) != set(params):
            missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
            raise KeyError(f"adapter state mismatch: missing {missing[:3]}, unexpected {extra[:3]}")
        for name, tensor in state.items():
            params[name].copy_(tensor)
