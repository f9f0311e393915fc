"""Embedded, seeded generator of verifiable tasks: the default dataset, no downloads needed.

Three families, each example a dict {"prompt": user-message text, "answer": reference string,
"task", "id", "metadata"}:

- `arithmetic`: "What is 7 + 34? Answer with just the number." Difficulty is set by digits per
  operand, operand count and operators. SmolLM2-135M-Instruct answers two-digit + two-digit
  additions greedily only 14% of the time (docs/DESIGN.md §5); the default mixes one- and two-digit
  operands so that accuracy sits in between and GRPO groups have reward variance.
- `chain` (chain.py): a chain of additions and subtractions worked out one line per step: a few
  hundred completion tokens per sample, the long-generation task of the DistillSparse study.
- `long_context`: a filler document of a few thousand words, built from seeded sentence
  templates, with facts ("The secret number of the blue box is 37.") buried at random depths and
  a question that needs them: the setting where the sparse-attention page selection matters.

The same config always yields the same examples. The held-out split is drawn from its own seed
stream first and the training split skips any prompt in it, so the two never overlap and the
held-out set does not change when `num_examples` does.

    python -m sparrow.tasks.generators   # prints one example of each family
"""

import operator
import random
from dataclasses import dataclass, replace
from typing import Any

from sparrow.tasks.chain import chain_example, chain_working

_OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_ANSWER_FORMAT = "Answer with just the number."
_WORKED_FORMAT = "Add the tens, then the ones, then the two sums."


@dataclass
class TaskConfig:
    kind: str = "arithmetic"  # task family: "arithmetic", "chain" or "long_context"
    num_examples: int = 2000  # examples in the training split
    num_heldout: int = 200  # examples in the held-out split (never overlaps the training split)
    seed: int = 0  # same seed and config -> the same examples, in the same order
    min_digits: int = 1  # arithmetic: fewest digits per operand
    max_digits: int = 2  # arithmetic: most digits per operand (drawn uniformly per operand)
    num_operands: int = 2  # arithmetic: operands per question
    operators: str = "+"  # arithmetic: operators drawn from, any of "+-*" (no precedence tricks)
    # arithmetic and chain: solved examples before every question, as earlier chat turns. The
    # same ones for every prompt (a shared prefix, like a system prompt), drawn from a seed
    # stream of their own and never asked as questions. They give sparse attention pages to skip.
    few_shot: int = 0
    # arithmetic few-shot answers: "worked" spells out the place-value steps before the sum
    # ("40 + 20 = 60, 2 + 9 = 11, 60 + 11 = 71."), a short chain of thought the model imitates;
    # "number" gives just the sum. worked needs two operands and "+".
    shot_answers: str = "worked"
    chain_steps: int = 30  # chain: operations per question, one line of working each
    context_words: int = 2600  # long_context: mean document length in words (~1.3 tokens each)
    context_jitter: float = 0.25  # long_context: lengths uniform in context_words * (1 +- jitter)
    num_needles: int = 1  # long_context: facts the question needs; >1 asks for their sum
    num_distractors: int = 1  # long_context: look-alike facts the question does not ask about


def generate_tasks(cfg: TaskConfig, split: str = "train") -> list[dict]:
    """The examples of one split ("train" or "heldout") of the task family `cfg.kind`."""
    _validate(cfg)
    if split not in ("train", "heldout"):
        raise ValueError(f"task split must be 'train' or 'heldout', got {split!r}")
    make = _MAKERS[cfg.kind]
    shots = few_shot_examples(cfg)
    exclude = {shot["prompt"] for shot in shots}
    heldout = _draw(make, cfg, "heldout", cfg.num_heldout, exclude)
    if split == "heldout":
        return _with_shots(heldout, shots, cfg)
    exclude |= {example["prompt"] for example in heldout}
    return _with_shots(_draw(make, cfg, "train", cfg.num_examples, exclude), shots, cfg)


def few_shot_examples(cfg: TaskConfig) -> list[dict]:
    """The `cfg.few_shot` solved examples every prompt starts with (none for 0)."""
    if not cfg.few_shot:
        return []
    if cfg.kind == "chain":
        return _draw(_chain_example, cfg, "shots", cfg.few_shot, set())
    # Two-digit operands, so that every step of a worked answer shows something.
    two_digit = replace(cfg, min_digits=2, max_digits=max(2, cfg.max_digits))
    return _draw(_arithmetic_example, two_digit, "shots", cfg.few_shot, set())


def _with_shots(examples: list[dict], shots: list[dict], cfg: TaskConfig) -> list[dict]:
    """Each example's prompt as chat turns: the solved examples, then its own question."""
    if not shots:
        return examples

    def ask(example: dict) -> dict:
        question = example["prompt"]
        if cfg.kind == "arithmetic" and cfg.shot_answers == "worked":
            question = question.replace(_ANSWER_FORMAT, _WORKED_FORMAT)
        return {"role": "user", "content": question}

    turns = []
    for shot in shots:
        turns.append(ask(shot))
        turns.append({"role": "assistant", "content": _shot_answer(shot, cfg.shot_answers)})
    return [{**e, "prompt": [*turns, ask(e)]} for e in examples]


def _shot_answer(shot: dict, style: str) -> str:
    if shot["task"] == "chain":
        return chain_working([tuple(step) for step in shot["metadata"]["steps"]])
    if style == "number":
        return shot["answer"]
    a, b = shot["metadata"]["operands"]
    tens, ones = (a // 10 + b // 10) * 10, a % 10 + b % 10
    steps = f"{a // 10 * 10} + {b // 10 * 10} = {tens}, {a % 10} + {b % 10} = {ones}"
    return f"{steps}, {tens} + {ones} = {a + b}."


def _validate(cfg: TaskConfig) -> None:
    if cfg.kind not in _MAKERS:
        raise ValueError(f"tasks.kind must be one of {sorted(_MAKERS)}, got {cfg.kind!r}")
    if cfg.num_examples < 0 or cfg.num_heldout < 0:
        raise ValueError("tasks.num_examples and tasks.num_heldout must be >= 0")
    if not 1 <= cfg.min_digits <= cfg.max_digits:
        raise ValueError(f"need 1 <= tasks.min_digits <= tasks.max_digits, got {cfg}")
    if cfg.num_operands < 2:
        raise ValueError(f"tasks.num_operands must be >= 2, got {cfg.num_operands}")
    if not cfg.operators or set(cfg.operators) - set(_OPERATORS):
        raise ValueError(
            f"tasks.operators must be a non-empty subset of '+-*', got {cfg.operators!r}"
        )
    if cfg.context_words < 1 or not 0.0 <= cfg.context_jitter < 1.0:
        raise ValueError("tasks.context_words must be >= 1 and 0 <= tasks.context_jitter < 1")
    if cfg.few_shot < 0 or (cfg.few_shot and cfg.kind == "long_context"):
        raise ValueError(f"tasks.few_shot must be >= 0, and 0 for kind=long_context: {cfg}")
    if cfg.chain_steps < 1:
        raise ValueError(f"tasks.chain_steps must be >= 1, got {cfg.chain_steps}")
    if cfg.shot_answers not in ("worked", "number"):
        raise ValueError(f"tasks.shot_answers must be worked or number: {cfg.shot_answers!r}")
    if (
        cfg.few_shot
        and cfg.kind == "arithmetic"
        and cfg.shot_answers == "worked"
        and (cfg.num_operands != 2 or cfg.operators != "+")
    ):
        raise ValueError("tasks.shot_answers=worked spells out two-operand sums: set number")
    if cfg.num_needles < 1 or cfg.num_distractors < 0:
        raise ValueError("tasks.num_needles must be >= 1 and tasks.num_distractors >= 0")
    if cfg.num_needles + cfg.num_distractors > len(_COLORS) * len(_CONTAINERS):
        raise ValueError("tasks.num_needles + tasks.num_distractors exceeds the distinct boxes")


def _draw(make, cfg: TaskConfig, split: str, count: int, exclude: set[str]) -> list[dict]:
    """`count` examples with distinct prompts, none in `exclude`, from the split's seed stream."""
    # String seeds go through sha512, so they are stable across runs and PYTHONHASHSEED.
    rng = random.Random(f"{cfg.kind}-{cfg.seed}-{split}")
    examples: list[dict] = []
    seen = set(exclude)
    # A small task space (e.g. one-digit sums) cannot supply many distinct prompts: give up
    # with a clear message rather than loop forever.
    for _ in range(20 * count + 100):
        if len(examples) == count:
            return examples
        example = make(cfg, rng)
        if example["prompt"] in seen:
            continue
        seen.add(example["prompt"])
        example["id"] = f"{cfg.kind}-{cfg.seed}-{split}-{len(examples)}"
        examples.append(example)
    if len(examples) == count:
        return examples
    raise ValueError(
        f"could only draw {len(examples)} distinct {cfg.kind} prompts of the {count} asked for; "
        "lower tasks.num_examples / tasks.num_heldout or widen the difficulty knobs"
    )


def _arithmetic_example(cfg: TaskConfig, rng: random.Random) -> dict:
    operands = []
    for _ in range(cfg.num_operands):
        digits = rng.randint(cfg.min_digits, cfg.max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        operands.append(rng.randint(low, 10**digits - 1))
    ops = [rng.choice(cfg.operators) for _ in range(cfg.num_operands - 1)]
    # The value is computed left to right, so a sum or difference followed by "*" is bracketed:
    # the written question then means what the answer says under the usual precedence.
    expression, value = str(operands[0]), operands[0]
    for i, (op, operand) in enumerate(zip(ops, operands[1:], strict=True)):
        if op == "*" and any(prev != "*" for prev in ops[:i]):
            expression = f"({expression})"
        value = _OPERATORS[op](value, operand)
        expression = f"{expression} {op} {operand}"
    return {
        "prompt": f"What is {expression}? {_ANSWER_FORMAT}",
        "answer": str(value),
        "task": "arithmetic",
        "metadata": {"operands": operands, "operators": ops},
    }


def _chain_example(cfg: TaskConfig, rng: random.Random) -> dict:
    return chain_example(cfg.chain_steps, rng)


def _long_context_example(cfg: TaskConfig, rng: random.Random) -> dict:
    low = cfg.context_words * (1.0 - cfg.context_jitter)
    high = cfg.context_words * (1.0 + cfg.context_jitter)
    target_words = max(1, round(rng.uniform(low, high)))
    sentences = []
    num_words = 0
    while num_words < target_words:
        sentence = _filler_sentence(rng)
        sentences.append(sentence)
        num_words += len(sentence.split())

    boxes = rng.sample(
        [(c, k) for c in _COLORS for k in _CONTAINERS], cfg.num_needles + cfg.num_distractors
    )
    values = rng.sample(range(10, 100), len(boxes))
    facts: list[dict[str, Any]] = []
    for (color, container), value in zip(boxes, values, strict=True):
        position = rng.randint(0, len(sentences))
        facts.append({"box": f"{color} {container}", "value": value, "position": position})
    # Depth is the fraction of the filler before the fact. Inserting from the back keeps the
    # earlier positions valid.
    num_filler = len(sentences)
    for fact in sorted(facts, key=lambda f: f["position"], reverse=True):
        template = rng.choice(_FACT_TEMPLATES)
        sentences.insert(fact["position"], template.format(box=fact["box"], value=fact["value"]))
    for fact in facts:
        fact["depth"] = round(fact.pop("position") / num_filler, 4)

    needles, distractors = facts[: cfg.num_needles], facts[cfg.num_needles :]
    if len(needles) == 1:
        question = f"What is the secret number of the {needles[0]['box']}?"
    else:
        names = ", ".join(f"the {n['box']}" for n in needles[:-1])
        question = f"What is the sum of the secret numbers of {names} and the {needles[-1]['box']}?"
    document = _paragraphs(sentences, rng)
    prompt = (
        "Read the document below and answer the question after it.\n\n"
        f"{document}\n\nQuestion: {question} {_ANSWER_FORMAT}"
    )
    return {
        "prompt": prompt,
        "answer": str(sum(n["value"] for n in needles)),
        "task": "long_context",
        "metadata": {
            "document_words": len(document.split()),
            "needles": needles,
            "distractors": distractors,
        },
    }


def _paragraphs(sentences: list[str], rng: random.Random) -> str:
    paragraphs = []
    start = 0
    while start < len(sentences):
        end = start + rng.randint(4, 8)
        paragraphs.append(" ".join(sentences[start:end]))
        start = end
    return "\n\n".join(paragraphs)


def _filler_sentence(rng: random.Random) -> str:
    template = rng.choice(_FILLER_TEMPLATES)
    slots: dict[str, object] = {name: rng.choice(words) for name, words in _VOCAB.items()}
    slots["n"] = rng.randint(2, 60)
    sentence = template.format(**slots)
    return sentence[0].upper() + sentence[1:]


_MAKERS = {
    "arithmetic": _arithmetic_example,
    "chain": _chain_example,
    "long_context": _long_context_example,
}
_COLORS = ["blue", "red", "green", "yellow", "purple", "orange", "silver", "golden", "black",
           "white", "brown", "pink"]  # fmt: skip
_CONTAINERS = ["box", "jar", "crate", "chest", "basket", "drawer", "envelope", "bag", "tin", "vase"]
_FACT_TEMPLATES = [
    "The secret number of the {box} is {value}.",
    "Note that the secret number of the {box} is {value}.",
    "Everyone agreed that the secret number of the {box} is {value}.",
]
_VOCAB = {
    "name": ["Mara", "Tobias", "Ines", "Kofi", "Lena", "Arjun", "Sofia", "Mateo", "Yuki", "Omar",
             "Clara", "Felix", "Amara", "Jonas", "Priya", "Henrik", "Noor", "Elias", "Rosa",
             "Dmitri", "Hana", "Lucas", "Zara", "Emil"],
    "place": ["harbor", "old library", "market square", "orchard", "train station", "bakery",
              "river bank", "workshop", "museum", "village hall", "greenhouse", "lighthouse",
              "school yard", "post office", "quiet street", "hill above the town", "museum garden"],
    "thing": ["lantern", "bicycle", "map", "kettle", "violin", "notebook", "umbrella", "clock",
              "garden gate", "telescope", "wooden bench", "sailboat", "letter", "painting",
              "recipe", "compass", "blanket", "staircase", "window", "bridge"],
    "adj": ["quiet", "bright", "dusty", "crowded", "narrow", "warm", "cold", "ancient", "tidy",
            "noisy", "peaceful", "windy", "colorful", "damp", "sunny", "fragile", "heavy"],
    "verb": ["repaired", "painted", "described", "carried", "studied", "cleaned", "photographed",
             "measured", "borrowed", "admired", "moved", "sketched", "examined", "wrapped"],
    "time": ["in the morning", "at noon", "late in the evening", "after lunch", "before dawn",
             "on Sunday", "during the storm", "in early spring", "at the end of summer",
             "on a foggy afternoon", "the next day", "in winter"],
    "feeling": ["curious", "tired", "cheerful", "patient", "nervous", "proud", "calm", "surprised",
                "thoughtful", "hopeful"],
    "weather": ["rain", "wind", "snow", "sunshine", "fog", "heat", "frost", "drizzle"],
}  # fmt: skip
_FILLER_TEMPLATES = [
    "{name} walked to the {place} {time} and found the {thing} surprisingly {adj}.",
    "{time}, {name} {verb} the {thing} near the {place}.",
    "the {place} was {adj} {time}, and {name} felt {feeling}.",
    "{name} once said that the {thing} at the {place} had been there for {n} years.",
    "people at the {place} talked about the {weather} while {name} {verb} a {adj} {thing}.",
    "{name} counted {n} birds on the roof of the {place} {time}.",
    "a {adj} {thing} stood by the door of the {place}, and nobody knew who had left it.",
    "{name} was {feeling} because the {thing} had to be {verb} before the {weather} came.",
    "the path from the {place} to the river was {adj}, so {name} walked slowly.",
    "{time} the {weather} kept most visitors away from the {place}.",
    "{name} wrote {n} pages about the {place} in a {adj} notebook.",
    "nobody remembered why the {thing} in the {place} was painted such a {adj} shade.",
    "{name} and a friend {verb} the {thing} together and then rested at the {place}.",
    "the guide explained that the {place} had changed a lot over the last {n} years.",
    "{name} felt {feeling} when the {weather} finally stopped {time}.",
    "a neighbour {verb} an old {thing} and gave it to {name} as a gift.",
    "it took {name} {n} minutes to reach the {place} through the {weather}.",
    "the {thing} looked {adj} in the light of the {place}, or so {name} thought.",
    "children from the {place} liked to visit {name}, who always had a {adj} story to tell.",
    "{name} kept the {thing} in a {adj} corner of the {place} for safekeeping.",
]


if __name__ == "__main__":
    for kind in _MAKERS:
        example = generate_tasks(TaskConfig(kind=kind, num_examples=1, num_heldout=0))[0]
        text = example["prompt"]
        print(f"--- {kind} ({len(text.split())} words)\n{text[:300]} ... {text[-200:]}")
        print(f"answer={example['answer']} metadata={example['metadata']}")
