"""LoRA RL of the policy (actor.lora.rank > 0) in the real trainer on the tiny preset, in process:
only the adapter trains; after a sync the engine's log-probs equal the actor's (adapter included)
to the engine's tolerance, which they do not without it (the adapter reached the engine); the
bytes synced are the adapter's; the KL reference is the base (adapter off, no copy); the export
writes a merged HF model and the peft adapter, which sparrow-eval and sparrow-generate read alike.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from hang_guard import HANG_GUARD_S
from tiny_lm import random_prompts

from sparrow.cli.config_loader import load_config
from sparrow.models.loading import ModelConfig, load_model
from sparrow.rl.reference import AdapterOffReference
from sparrow.train.trainer import GRPOTrainer

TOL = 1e-4  # the engine's tolerance against the HF forward (tests/rollout/test_engine.py)
OVERRIDES = ["preset=tiny", "actor.lora.rank=4", "rl.loss.kl_coef=0.1", "rl.eval.every=0"]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lora_rl")
    trainer = GRPOTrainer.from_config(load_config([*OVERRIDES, "rl.steps=1", f"run_dir={run_dir}"]))
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)  # peft starts B at 0: a visible adapter before any update
        for name, p in trainer.actor.model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.3)
    trainer.synced = trainer._sync_engine()
    return trainer


def _pairs(trainer, n=3):
    vocab = trainer.actor.model.config.vocab_size
    return random_prompts(vocab, [9, 14, 6][:n], seed=1), random_prompts(vocab, [7, 5, 10][:n], 2)


def _actor_logprobs(trainer, prompts, completions):
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    out = trainer.actor.compute_logprobs(ids, mask, topk=0).token_logprobs  # (B, T)
    pairs = enumerate(zip(prompts, completions, strict=True))
    return [out[i, len(p) : len(p) + len(c)] for i, (p, c) in pairs]


def _engine_logprobs(trainer, prompts, completions):
    scored = trainer.engine.score(prompts, completions)
    return [
        s.log_softmax(-1)[torch.arange(len(c)), torch.tensor(c)]
        for s, c in zip(scored, completions, strict=True)
    ]


def _max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_only_the_adapter_trains(trainer):
    trainable = [n for n, p in trainer.actor.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    held = [p for g in trainer.actor.engine.optimizer.param_groups for p in g["params"]]
    assert sum(p.numel() for p in held) == sum(
        p.numel() for p in trainer.actor.model.parameters() if p.requires_grad
    )


def test_after_a_sync_the_engine_equals_the_actor_with_its_adapter(trainer):
    prompts, completions = _pairs(trainer)
    actor = _actor_logprobs(trainer, prompts, completions)
    assert _max_diff(_engine_logprobs(trainer, prompts, completions), actor) <= TOL
    adapter = trainer.actor.adapter_factors()
    try:  # not vacuous: the engine's base alone is another policy
        trainer.engine.set_policy_lora(None)
        assert _max_diff(_engine_logprobs(trainer, prompts, completions), actor) > 1e-2
    finally:
        trainer.engine.set_policy_lora(adapter)


def test_the_sync_moves_the_adapter_bytes_only(trainer):
    adapter = trainer.actor.adapter_factors()
    adapter_bytes = sum(a.numel() + b.numel() for a, b in adapter.values()) * 4  # fp32 engine
    full = sum(p.numel() for p in trainer.actor.model.parameters()) * 4
    assert trainer.synced == {"sync/engine_bytes": float(adapter_bytes)}
    assert adapter_bytes < full / 10


def test_the_kl_reference_is_the_base_with_the_adapter_off(trainer):
    reference = trainer.policy_update.reference
    assert isinstance(reference, AdapterOffReference)  # no copy of the weights
    prompts, completions = _pairs(trainer, 2)
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(map(len, rows))
    mb = {
        "input_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
    }
    ref = reference.token_logprobs(mb, 1.0)
    base = load_model(ModelConfig("tiny-qwen3"))
    with torch.no_grad():
        hf = base.model(mb["input_ids"], attention_mask=mb["attention_mask"]).logits
    hf = hf[:, :-1].log_softmax(-1).gather(-1, mb["input_ids"][:, 1:, None])[..., 0]  # (B, T-1)
    for i, r in enumerate(rows):
        assert float((ref[i, 1 : len(r)] - hf[i, : len(r) - 1]).abs().max()) <= TOL
    # ...while the actor itself still holds its adapter (the context restored it).
    actor = _actor_logprobs(trainer, prompts, completions)[0]
    assert float((actor - ref[0, 9:16]).abs().max()) > 1e-2


def test_the_export_is_read_by_eval_and_generate_as_adapter_and_merged(trainer, tmp_path):
    trainer.fit()  # one step, then the export
    policy = trainer.run_dir / "policy"
    assert (policy / "config.json").is_file()
    assert (policy / "adapter" / "adapter_config.json").is_file()
    assert (policy / "adapter" / "adapter_model.safetensors").is_file()
    merged, adapter = (
        load_model(ModelConfig(str(policy))),
        load_model(ModelConfig(str(policy / "adapter"))),
    )
    prompts, completions = _pairs(trainer)
    actor = _actor_logprobs(trainer, prompts, completions)
    for lm in (merged, adapter):
        ids = torch.tensor([prompts[0] + completions[0]])
        with torch.no_grad():
            logits = lm.model(ids).logits[0, len(prompts[0]) - 1 : -1].log_softmax(-1)
        ours = logits[torch.arange(len(completions[0])), torch.tensor(completions[0])]
        assert float((ours - actor[0]).abs().max()) <= TOL
    outputs = {}
    for name, path in (("merged", policy), ("adapter", policy / "adapter")):
        evaluated = _cli("sparrow.cli.eval_policy", [str(path), "--limit", "4", "--json"])
        outputs[name] = json.loads(evaluated.splitlines()[-1])
        out = tmp_path / f"{name}.jsonl"
        _cli(
            "sparrow.cli.generate",
            [
                "--model",
                str(path),
                "--prompts",
                "tasks",
                "--limit",
                "3",
                "--max-tokens",
                "6",
                "--out",
                str(out),
            ],
        )
        rows = [json.loads(x) for x in out.read_text().splitlines() if x]
        outputs[name + "_gen"] = [r["token_ids"] for r in rows]
        outputs[name + "_lp"] = torch.tensor([lp for r in rows for lp in r["logprobs"]])
    drop = ("policy",)
    assert {k: v for k, v in outputs["merged"].items() if k not in drop} == {
        k: v for k, v in outputs["adapter"].items() if k not in drop
    }
    assert outputs["merged_gen"] == outputs["adapter_gen"]
    assert float((outputs["merged_lp"] - outputs["adapter_lp"]).abs().max()) <= TOL


def _cli(module: str, args: list[str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
