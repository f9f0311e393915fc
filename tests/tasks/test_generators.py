"""Embedded task generator: determinism, disjoint splits, correct answers, long-context lengths."""

import re

import pytest

from sparrow.tasks.generators import TaskConfig, generate_tasks


def _long(**overrides) -> TaskConfig:
    fields = dict(kind="long_context", num_examples=12, num_heldout=4, context_words=600)
    return TaskConfig(**(fields | overrides))


@pytest.mark.parametrize("kind", ["arithmetic", "long_context"])
def test_same_seed_same_examples_other_seed_different(kind):
    cfg = TaskConfig(kind=kind, num_examples=20, num_heldout=5, context_words=300)
    assert generate_tasks(cfg) == generate_tasks(cfg)
    other = generate_tasks(
        TaskConfig(kind=kind, num_examples=20, num_heldout=5, context_words=300, seed=1)
    )
    assert [e["prompt"] for e in other] != [e["prompt"] for e in generate_tasks(cfg)]


@pytest.mark.parametrize("kind", ["arithmetic", "long_context"])
def test_splits_are_disjoint_and_heldout_is_stable(kind):
    cfg = TaskConfig(kind=kind, num_examples=300, num_heldout=100, context_words=200)
    train = generate_tasks(cfg, "train")
    heldout = generate_tasks(cfg, "heldout")
    assert len(train) == 300 and len(heldout) == 100
    train_prompts = {e["prompt"] for e in train}
    assert len(train_prompts) == 300  # distinct within the split
    assert not train_prompts & {e["prompt"] for e in heldout}
    # Growing the training set must not move examples into or out of the held-out set.
    bigger = TaskConfig(kind=kind, num_examples=400, num_heldout=100, context_words=200)
    assert generate_tasks(bigger, "heldout") == heldout


def test_arithmetic_answers_match_the_question():
    cfg = TaskConfig(num_examples=300, num_heldout=0, num_operands=3, operators="+-*")
    for example in generate_tasks(cfg):
        expression = re.fullmatch(
            r"What is (.+)\? Answer with just the number\.", example["prompt"]
        )
        assert expression is not None, example["prompt"]
        # eval applies the usual precedence: the brackets the generator writes must make it
        # agree with the answer, which is computed left to right.
        assert str(eval(expression.group(1))) == example["answer"], example["prompt"]


def test_arithmetic_digit_knobs_bound_the_operands():
    cfg = TaskConfig(num_examples=200, num_heldout=0, min_digits=2, max_digits=3)
    operands = [x for e in generate_tasks(cfg) for x in e["metadata"]["operands"]]
    assert all(10 <= x <= 999 for x in operands)
    assert {len(str(x)) for x in operands} == {2, 3}  # both digit counts are drawn


def test_small_task_space_fails_with_a_clear_message():
    cfg = TaskConfig(num_examples=200, num_heldout=0, min_digits=1, max_digits=1)  # 100 sums
    with pytest.raises(ValueError, match="distinct arithmetic prompts"):
        generate_tasks(cfg)


def test_bad_config_and_split_are_rejected():
    with pytest.raises(ValueError, match="tasks.kind"):
        generate_tasks(TaskConfig(kind="poetry"))
    with pytest.raises(ValueError, match="tasks.operators"):
        generate_tasks(TaskConfig(operators="+/"))
    with pytest.raises(ValueError, match="split"):
        generate_tasks(TaskConfig(num_examples=1, num_heldout=0), "test")


def test_long_context_prompts_reach_the_target_length_and_vary():
    cfg = _long(num_examples=30, context_words=2000, context_jitter=0.25)
    words = [len(e["prompt"].split()) for e in generate_tasks(cfg)]
    # Document words land in [1500, 2500] plus a filler sentence of overshoot; the instruction,
    # question and facts add a few dozen more.
    assert all(1500 <= w <= 2500 + 80 for w in words), words
    assert max(words) - min(words) > 200  # lengths vary across examples
    assert sum(words) / len(words) == pytest.approx(2000, rel=0.15)


def test_long_context_facts_are_buried_and_the_answer_needs_them():
    cfg = _long(num_examples=40, num_needles=2, num_distractors=2)
    depths = []
    for example in generate_tasks(cfg):
        prompt, meta = example["prompt"], example["metadata"]
        facts = meta["needles"] + meta["distractors"]
        assert len(facts) == 4 and len({f["box"] for f in facts}) == 4
        for fact in facts:
            assert re.search(rf"secret number of the {fact['box']} is {fact['value']}\.", prompt)
            depths.append(fact["depth"])
        # The filler never mentions secret numbers: the facts and the question are the only ones.
        assert prompt.count("secret number") == 4 + 1
        question = prompt.rsplit("Question:", 1)[1]
        assert all(n["box"] in question for n in meta["needles"])
        assert not any(d["box"] in question for d in meta["distractors"])
        assert example["answer"] == str(sum(n["value"] for n in meta["needles"]))
    assert min(depths) < 0.2 and max(depths) > 0.8  # facts spread through the document


def test_long_context_single_needle_asks_for_its_value():
    example = generate_tasks(_long(num_examples=1, num_heldout=0, num_distractors=0))[0]
    (needle,) = example["metadata"]["needles"]
    assert f"What is the secret number of the {needle['box']}?" in example["prompt"]
    assert example["answer"] == str(needle["value"])


def test_few_shot_prompts_share_worked_examples_never_asked():
    cfg = TaskConfig(num_examples=300, num_heldout=50, few_shot=3)
    train, heldout = generate_tasks(cfg, "train"), generate_tasks(cfg, "heldout")
    prefix = train[0]["prompt"][:-1]
    assert len(prefix) == 6 and [t["role"] for t in prefix] == ["user", "assistant"] * 3
    # One shared prefix (like a system prompt): every prompt of both splits starts with it.
    assert all(e["prompt"][:-1] == prefix for e in train + heldout)
    for question, answer in zip(prefix[::2], prefix[1::2], strict=True):
        a, b = map(int, re.findall(r"\d+", question["content"]))
        assert a >= 10 and b >= 10  # two-digit operands: every worked step shows something
        assert answer["content"].endswith(f" = {a + b}.")  # the worked answer ends in the sum
        assert str(a // 10 * 10 + b // 10 * 10) in answer["content"]
    asked = [e["prompt"][-1]["content"] for e in train + heldout]
    assert len(set(asked)) == 350  # distinct, disjoint splits
    assert not {q["content"] for q in prefix[::2]} & set(asked)  # a shot is never a question
    # The held-out questions do not depend on the shots: the same ones without them.
    plain = generate_tasks(TaskConfig(num_examples=300, num_heldout=50), "heldout")
    assert [e["answer"] for e in heldout] == [e["answer"] for e in plain]


def test_few_shot_settings_are_checked():
    with pytest.raises(ValueError, match="worked"):
        generate_tasks(TaskConfig(few_shot=2, operators="+*"))
    with pytest.raises(ValueError, match="few_shot"):
        generate_tasks(TaskConfig(kind="long_context", few_shot=2))
    numbers = generate_tasks(TaskConfig(num_examples=5, few_shot=2, shot_answers="number"))
    assert numbers[0]["prompt"][1]["content"].isdigit()
