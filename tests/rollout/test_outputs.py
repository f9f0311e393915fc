"""TokenRecords: per-step writes land at (sequence, position), and the buffers grow on demand."""

import torch

from sparrow.rollout.outputs import TokenRecords
from sparrow.rollout.sampler import SamplerOutput


def fake_step(values: list[float], k: int) -> SamplerOutput:
    v = torch.tensor(values)  # (B,)
    return SamplerOutput(
        token_ids=v.long(),
        logprobs=-v,
        sampling_logprobs=-v / 2,
        topk_ids=v.long()[:, None].expand(-1, k),
        topk_logprobs=-v[:, None].expand(-1, k),
    )


def test_records_grow_past_the_initial_capacity_and_keep_earlier_steps():
    records = TokenRecords(num_seqs=3, max_tokens=600, topk=2, device=torch.device("cpu"))
    assert records.capacity == 256
    for t in range(600):  # sequence 1 only runs until 300; sequence 2 never does
        seqs = [0, 1] if t < 300 else [0]
        values = [float(t), float(1000 + t)][: len(seqs)]
        records.write(
            seqs, [t] * len(seqs), fake_step(values, 2), [t % 7] * len(seqs), [t] * len(seqs)
        )
    assert records.capacity == 600
    out0 = records.output(
        0,
        600,
        prompt_index=0,
        sample_index=0,
        prompt_ids=[],
        token_ids=[],
        text="",
        finish_reason="length",
        num_preemptions=0,
    )
    assert torch.equal(out0.logprobs, -torch.arange(600.0))
    assert torch.equal(out0.topk_ids[:, 1], torch.arange(600))
    assert out0.topk_ids.dtype == torch.int64
    assert torch.equal(out0.budget_pages, torch.arange(600, dtype=torch.int32) % 7)
    out1 = records.output(
        1,
        300,
        prompt_index=0,
        sample_index=1,
        prompt_ids=[],
        token_ids=[],
        text="",
        finish_reason="eos",
        num_preemptions=0,
    )
    assert torch.equal(out1.sampling_logprobs, -(1000 + torch.arange(300.0)) / 2)
    assert out1.logprobs.shape == (300,) and out1.logprobs._base is None  # a copy, not a view
