"""How far AdamW moves the policy on GRPO steps that carry no signal.

A GRPO step whose groups all have equal rewards (all wrong, or all right) has zero advantages,
so zero gradients. AdamW still steps: its first moment remembers the last real gradient, and
with bias correction early in a run the step is of the order of the learning rate per weight.
So every no-signal step after a real one repeats (a decaying copy of) that update. This script
measures it on the embedded SmolLM2: one real policy-gradient step on a few-shot arithmetic
batch, then no-signal steps, and the KL divergence from the starting policy after each one
(mean over the completion tokens of a second batch), with and without skipping those steps.

    python -m sparrow.experiments.zero_signal_drift [--lr 3e-5] [--steps 6]
"""

import argparse
import copy
import json

import torch
import torch.nn.functional as F

from sparrow.models.loading import ModelConfig, load_model
from sparrow.tasks.generators import TaskConfig, generate_tasks


def _batch(tokenizer, examples: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + reference answer per example, right-padded: (ids, attention, completion mask)."""
    rows, masks = [], []
    for e in examples:
        text = tokenizer.apply_chat_template(
            e["prompt"], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = tokenizer(e["answer"], add_special_tokens=False)["input_ids"]
        rows.append(prompt + answer)
        masks.append([0] * len(prompt) + [1] * len(answer))
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    completion = torch.tensor([m + [0] * (width - len(m)) for m in masks])
    return ids, attention, completion


def _token_logprobs(model, ids, attention) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    return F.log_softmax(logits, -1)  # (B, T - 1, V)


@torch.no_grad()
def _kl(model, reference_logprobs, ids, attention, completion) -> float:
    """Mean over completion tokens of KL(reference || model)."""
    logprobs = _token_logprobs(model, ids, attention)
    kl = (reference_logprobs.exp() * (reference_logprobs - logprobs)).sum(-1)  # (B, T - 1)
    mask = completion[:, 1:].bool()
    return float(kl[mask].mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--steps", type=int, default=6, help="no-signal steps after the real one")
    p.add_argument("--rows", type=int, default=6)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    lm = load_model(ModelConfig("smollm2-135m-instruct", dtype="float32"))
    examples = generate_tasks(TaskConfig(few_shot=3, num_examples=2 * args.rows, num_heldout=0))
    train = _batch(lm.tokenizer, examples[: args.rows])
    probe = _batch(lm.tokenizer, examples[args.rows :])
    # Half the rows rewarded, half not: a real GRPO step's advantages (+1 / -1).
    advantages = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(args.rows)])
    with torch.no_grad():
        reference = _token_logprobs(lm.model, *probe[:2])

    results = {}
    for skip in (False, True):
        model = copy.deepcopy(lm.model)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        kls: list[float] = []
        for step in range(1 + args.steps):
            signal = advantages if step == 0 else torch.zeros_like(advantages)
            if step > 0 and skip:
                kls.append(kls[-1])  # the update is skipped: weights and Adam state untouched
                continue
            ids, attention, completion = train
            logprobs = _token_logprobs(model, ids, attention)
            taken = logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T - 1)
            mask = completion[:, 1:].float()
            loss = -(signal[:, None] * taken * mask).sum() / mask.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            kls.append(_kl(model, reference, *probe))
            print(f"skip={skip} step {step} signal={step == 0} KL={kls[-1]:.3e}", flush=True)
        results["skip" if skip else "adamw"] = kls
    growth = results["adamw"][-1] / results["adamw"][0]
    print(json.dumps({"lr": args.lr, "kl_per_step": results, "drift_factor": growth}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
