"""LoRA RL of the policy (`actor.lora.rank` > 0): a peft adapter trained on the frozen base.

The actor wraps its model with peft before DeepSpeed sees it (`wrap`): only the adapter's A and B
matrices require grad, so the optimizer, its state and the gradients are the adapter's alone.
What leaves the actor is the adapter too:
- the weight sync (`factors`; over the wire as sparrow.rollout.lora.wire_tensors): HF module
  name -> (A (r, in), alpha/r * B (out, r)), the form the rollout engine's LoRA path takes
  (sparrow.rollout.lora), applied at every engine forward, unmerged (docs/DESIGN.md, "LoRA RL
  of the policy");
- the KL reference: the same model with the adapter switched off (peft's `disable_adapter`), so
  no second copy of the base is held;
- the export (`merged_state_dict`): the adapter in peft's format beside a merged HF model.

Tensors here are the caller's: under ZeRO-3 the actor gathers them first (deepspeed stays in
sparrow/rl/actor.py).
"""

from collections.abc import Mapping

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn
from transformers import PreTrainedModel

from sparrow.rl.actor_config import PolicyLoraConfig

ADAPTER = "default"  # peft's name for the one adapter


def wrap(model: PreTrainedModel, cfg: PolicyLoraConfig) -> PeftModel:
    """`model` with a fresh LoRA adapter injected in place (peft's init: B = 0, so the adapted
    policy starts as the base); every base parameter frozen."""
    lora = LoraConfig(  # peft annotates lora_alpha int; a float scales as alpha / r too
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]
        lora_dropout=cfg.dropout,
        target_modules=cfg.modules(),
    )
    return get_peft_model(model, lora)


def lora_layers(model: nn.Module) -> dict[str, LoraLayer]:
    """HF module name (`model.layers.3.self_attn.q_proj`) -> its LoRA layer."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every A and B matrix of the adapter, in module order (what a sync must gather)."""
    params: list[nn.Parameter] = []
    for layer in lora_layers(model).values():
        params += [_weight(layer.lora_A[ADAPTER]), _weight(layer.lora_B[ADAPTER])]
    return params


def factors(model: nn.Module) -> dict[str, tuple[Tensor, Tensor]]:
    """The adapter for `LLMEngine.set_policy_lora`: HF module name -> (A (r, in), s B (out, r)),
    s = alpha / r, detached copies (the parameters must be whole: gathered under ZeRO-3)."""
    out = {}
    for name, layer in lora_layers(model).items():
        a = _weight(layer.lora_A[ADAPTER]).detach().clone()
        b = _weight(layer.lora_B[ADAPTER]).detach() * layer.scaling[ADAPTER]
        out[name] = (a, b)
    return out


def base_names(model: nn.Module) -> dict[str, str]:
    """The model's state-dict names (LoRA-wrapped layers hold their weight under `base_layer`)
    -> the HF names of the base weights; the adapter's own tensors left out."""
    return {
        name: name.replace(".base_layer.", ".")
        for name in model.state_dict(keep_vars=True)
        if ".lora_" not in name
    }


@torch.no_grad()
def merged_state_dict(
    state: Mapping[str, Tensor], adapter: Mapping[str, tuple[Tensor, Tensor]]
) -> dict[str, Tensor]:
    """HF-named full weights of the adapted policy: the base's `state` (HF names) with
    W + s B A for every adapted module, computed in fp32 and stored in W's dtype."""
    merged = dict(state)
    for name, (a, b) in adapter.items():
        w = merged[f"{name}.weight"]
        merged[f"{name}.weight"] = (w.float() + b.float() @ a.float()).to(w.dtype)
    return merged


def _weight(linear: nn.Module) -> nn.Parameter:
    weight = linear.weight
    assert isinstance(weight, nn.Parameter)
    return weight
