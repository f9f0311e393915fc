"""rl.loss.kl_coef > 0 through the loop (FakeActor, tiny model): the reference is the initial
weights, so the KL is 0 at step 1 (policy = reference) and > 0 after the first update, equal to
k3 by hand from an independent forward of the initial model."""

import copy
import json

import pytest
import torch
from test_loop_fake_actor import _trainer


def test_kl_to_the_initial_weights(tmp_path):
    trainer = _trainer(tmp_path, "rl.steps=2", "rl.loss.kl_coef=0.05", "rl.skip_no_signal=false")
    initial = copy.deepcopy(trainer.actor.model).eval()
    seen = []
    real_train_step = trainer.actor.train_step

    def train_step(micro_batches, loss_fn, temperature):
        seen.append(micro_batches)
        return real_train_step(micro_batches, loss_fn, temperature)

    trainer.actor.train_step = train_step
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["update/kl_ref"] == 0.0  # bit-equal log-probs before any update
    assert rows[1]["update/kl_ref"] > 0.0
    # Step 2 by hand: k3 = e^d - d - 1, d = log p_ref - log p, over the completion tokens, with
    # p the policy before step 2's update (the old log-probs) and p_ref the initial model.
    num, den = 0.0, 0.0
    with torch.no_grad():
        for mb in seen[1]:
            logits = initial(mb["input_ids"], attention_mask=mb["attention_mask"]).logits
            ref = logits[:, :-1].float().log_softmax(-1)
            ref = ref.gather(-1, mb["input_ids"][:, 1:, None])[..., 0]  # (b, T - 1)
            mask = mb["completion_mask"][:, 1:]
            d = (ref - mb["old_logprobs"][:, 1:])[mask].double()
            num += float((d.exp() - d - 1).sum())
            den += float(mask.sum())
    assert rows[1]["update/kl_ref"] == pytest.approx(num / den, rel=1e-3, abs=1e-7)
