"""The long-generation task (sparrow/tasks/chain.py): deterministic examples with consistent
chains, prompt and working lengths in SmolLM2's own tokens, and the chain reward on known good
and bad completions."""

import random

import pytest
from transformers import AutoTokenizer

from sparrow.models.loading import smollm2_dir
from sparrow.tasks.chain import MAX_VALUE, chain_reward, chain_working, draw_chain
from sparrow.tasks.data import DataConfig, load_prompts
from sparrow.tasks.generators import TaskConfig, generate_tasks
from sparrow.tasks.rewards import RewardConfig, build_reward

CHAIN = TaskConfig(kind="chain", num_examples=40, num_heldout=8, chain_steps=30, few_shot=1)


def test_same_config_same_examples_and_splits_disjoint():
    train, heldout = generate_tasks(CHAIN, "train"), generate_tasks(CHAIN, "heldout")
    assert train == generate_tasks(CHAIN, "train")
    other = generate_tasks(TaskConfig(**{**CHAIN.__dict__, "seed": 1}), "train")
    assert [e["prompt"] for e in other] != [e["prompt"] for e in train]
    assert not {str(e["prompt"]) for e in train} & {str(e["prompt"]) for e in heldout}


def test_chains_stay_in_range_and_answer_is_the_last_value():
    rng = random.Random(0)
    for _ in range(200):
        start, steps = draw_chain(rng, 30)
        assert steps[0][0] == start and len(steps) == 30
        for (a, op, b, c), nxt in zip(steps, [*steps[1:], None], strict=True):
            assert 10 <= b <= 99 and 0 <= c <= MAX_VALUE
            assert c == (a + b if op == "+" else a - b)
            assert nxt is None or nxt[0] == c
    example = generate_tasks(CHAIN, "heldout")[0]
    assert example["answer"] == str(example["metadata"]["steps"][-1][3])


def _prompt(example) -> str:
    """The chat turns as one text, like a templated prompt: solved example(s), then the question."""
    return "\n".join(turn["content"] for turn in example["prompt"])


def test_reward_scores_good_and_bad_working():
    example = generate_tasks(CHAIN, "heldout")[0]
    steps = [tuple(s) for s in example["metadata"]["steps"]]
    prompt, reference = _prompt(example), example["answer"]
    good = chain_working(steps)
    assert chain_reward(prompt, good, reference).score == 1.0
    # A slip at step 11 (index 10): ten steps count, the rest and the answer line do not.
    lines = good.splitlines()
    a, op, b, c = steps[10]
    lines[10] = f"{a} {op} {b} = {c + 1}"
    assert chain_reward(prompt, "\n".join(lines), reference).score == pytest.approx(10 / 31)
    # All steps right, no answer line: 30 of 31; a wrong answer line: the same.
    no_answer = "\n".join(good.splitlines()[:-1])
    assert chain_reward(prompt, no_answer, reference).score == pytest.approx(30 / 31)
    wrong_answer = good.rsplit("Answer:", 1)[0] + f"Answer: {steps[-1][3] + 1}"
    assert chain_reward(prompt, wrong_answer, reference).score == pytest.approx(30 / 31)
    assert chain_reward(prompt, "I do not know.", reference).score == 0.0
    # The solved example's working in the prompt is not this question's.
    shot = generate_tasks(CHAIN, "train")[0]["prompt"][1]["content"]
    assert chain_reward(prompt, shot, reference).score == 0.0
    with pytest.raises(ValueError):  # a reference that is not the chain's result
        chain_reward(prompt, good, str(int(reference) + 1))


def test_chain_reward_is_registered_and_guarded():
    reward = build_reward(RewardConfig(name="chain"))
    example = generate_tasks(CHAIN, "heldout")[1]
    steps = [tuple(s) for s in example["metadata"]["steps"]]
    assert reward(_prompt(example), chain_working(steps), example["answer"]).score == 1.0
    assert reward("no question here", "1 + 1 = 2", "2").score == 0.0
    assert reward.stats.errors == 1


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(smollm2_dir())


def test_prompt_and_working_lengths_in_smollm2_tokens(tokenizer):
    """The sizes the DistillSparse study is planned on (conf/data/chain.yaml): 844-token prompts
    (one solved 30-step chain, then the question) and ~380-token solved workings."""
    data = load_prompts(DataConfig(tasks=CHAIN), tokenizer)
    lengths = [len(p.token_ids) for p in data.prompts]
    # Two-digit operands and one shared solved chain: every prompt has the same token count.
    assert set(lengths) == {844}, sorted(set(lengths))
    workings = [
        len(tokenizer(chain_working([tuple(s) for s in e["metadata"]["steps"]]))["input_ids"])
        for e in generate_tasks(CHAIN, "heldout")
    ]
    assert 330 <= min(workings) and max(workings) <= 420, workings
    # The reward reads the templated prompt as the trainer passes it.
    prompt = data.prompts[0]
    assert chain_reward(prompt.text, "", prompt.answer).score == 0.0
