"""Each rehearsal fails on a fault planted in a copy of a sparrow function, with a message that
names the planted line (planted.py compiles the copy under the real file and line numbers; the
test swaps it in with monkeypatch, nothing else of sparrow's changes):
- a tensor made on the CPU inside the decode path (a `torch.arange` without a device);
- an `.item()` in the forward (prefill and decode share it);
- an fp32 upcast on the bf16 hot path;
- an `.item()` on an activation in the actor's log-prob pass (the trainer rehearsal).
The engine runs the same rehearsal as test_engine_rehearsal.py, with a short shared prompt.
"""

import pytest
from engine_rehearsal import rehearse_engine
from hot_path import RehearsalFault
from planted import planted
from trainer_rehearsal import rehearse_trainer

from sparrow.rl.policy_logprobs import PolicyWithLogprobs
from sparrow.rollout.model import DecoderModel
from sparrow.rollout.paged_attention import PagedKVCache

ENGINE_FAULTS = {
    "cpu tensor in decode": (
        PagedKVCache, "decode_attention", "k_cache, v_cache = self.k[layer], self.v[layer]",
        "torch.arange(q.shape[0])", "CPU tensor made in the decode forward (arange)",
    ),
    "item in forward": (
        DecoderModel, "_forward", "x, h = self._add_norm(x, mlp_out, w.input_norm)",
        "x.abs().max().item()", "host sync (_local_scalar_dense) in the prefill forward",
    ),
    "fp32 upcast": (
        DecoderModel, "_forward", "gate_up = self._project(",
        "h = h.float()", "fp32 upcast on the half-precision prefill forward (to -> (528, 2048))",
    ),
}  # fmt: skip


@pytest.mark.parametrize("fault", ENGINE_FAULTS)
def test_engine_rehearsal_names_the_planted_line(fault, monkeypatch):
    owner, name, anchor, statement, what = ENGINE_FAULTS[fault]
    copy, site = planted(getattr(owner, name), anchor, statement)
    monkeypatch.setattr(owner, name, copy)
    with pytest.raises(RehearsalFault) as failure:
        rehearse_engine(cuda_graphs=True, sparse=True, context=600, n=2, max_tokens=2)
    message = str(failure.value)
    print(f"\n[{fault}] {message}")
    assert message.startswith(what)
    assert f" at {site} ({name})" in message.splitlines()[0]


def test_trainer_rehearsal_names_the_planted_line(monkeypatch):
    anchor = "logprobs = F.log_softmax(logits, dim=-1)"
    copy, site = planted(PolicyWithLogprobs._score_chunk, anchor, "logits.max().item()")
    monkeypatch.setattr(PolicyWithLogprobs, "_score_chunk", copy)
    with pytest.raises(RehearsalFault) as failure:
        rehearse_trainer(prompt=64, completion=192, distill_tokens=64)
    message = str(failure.value)
    print(f"\n[item in actor forward] {message}")
    assert message.startswith("host sync (_local_scalar_dense: its result depends on tensor")
    assert f" at {site} (_score_chunk)" in message.splitlines()[0]
