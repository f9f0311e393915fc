"""Math reward: extract the final answer of a completion, compare it with math-verify.

The answer is the content of the last `\\boxed{...}` (nested braces handled; an unclosed box, as
in a truncated completion, does not count), else, with the default fallback, the last number in
the completion. Equivalence is math-verify's (`1/2` equals `0.5` and `\\frac{1}{2}`): both sides
are parsed as `\\boxed{...}` so a reference may be plain ("37") or LaTeX ("\\frac{1}{2}").

Parsing and verification run in a `Sandbox` worker process with math-verify's signal-based
timeouts switched off, so a call from any thread ends within `timeout_s`; a runaway expression
raises `RewardTimeout`, which the reward guard counts and scores 0.
"""

import importlib.util
import logging
import re
from typing import Literal

from sparrow.tasks.reward_result import RewardResult, RewardTimeout
from sparrow.tasks.sandbox import Sandbox, SandboxTimeout

AnswerFallback = Literal["last_number", "none"]

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Thousands separators ("1,234") or plain decimals, optionally a fraction "3/4". A sign counts
# only when it does not follow a word or digit, so "5-3" ends in 3, "x = -3" in -3.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?")


def extract_boxed(text: str) -> str | None:
    """Content of the last balanced \\boxed{...} (or \\fbox{...}) in `text`, else None."""
    found = None
    for match in _BOX_OPEN.finditer(text):
        depth = 1
        for end in range(match.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                found = text[match.end() : end]
                break
    return found


def extract_last_number(text: str) -> str | None:
    """The last number in `text` with thousands separators removed ("1,234" -> "1234")."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def extract_answer(text: str, fallback: AnswerFallback = "last_number") -> tuple[str, str] | None:
    """(answer, how) with how "boxed" or "last_number"; None when no answer is found."""
    boxed = extract_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip(), "boxed"
    if fallback == "last_number":
        number = extract_last_number(text)
        if number is not None:
            return number, "last_number"
    return None


def _equivalent(answer: str, reference: str) -> bool:
    """math-verify equivalence; runs inside the sandbox worker, so no signal timeouts."""
    from math_verify import parse, verify

    gold = parse(f"\\boxed{{{reference}}}", parsing_timeout=None)
    predicted = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    if not gold or not predicted:
        return False
    return bool(verify(gold, predicted, timeout_seconds=None))


def _init_worker() -> None:
    # The "timeout is disabled" warning is expected here: the sandbox is the timeout.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _equivalent("1", "1")  # import SymPy and the LaTeX parser before the first deadline


class MathVerifier:
    """Reward 1.0 when the completion's final answer equals the reference, else 0.0."""

    enforces_timeout = True  # tells the reward guard not to add its own thread deadline

    def __init__(self, timeout_s: float = 5.0, fallback: AnswerFallback = "last_number"):
        if fallback not in ("last_number", "none"):
            raise ValueError(f"answer fallback must be 'last_number' or 'none', got {fallback!r}")
        # Checked here, not in the sandbox worker: there an ImportError would be one more failed
        # call, each scoring 0, and a run without math-verify would train on all-zero rewards.
        if importlib.util.find_spec("math_verify") is None:
            raise ImportError(
                "the math reward needs math-verify (pip install math-verify, or the wheel folder "
                "of scripts/gpu_wheels.sh); for short exact answers set reward.name=exact_match"
            )
        self.timeout_s = timeout_s
        self.fallback = fallback
        self.sandbox = Sandbox(init=_init_worker)

    def __call__(self, prompt: str, completion: str, reference: str) -> RewardResult:
        extracted = extract_answer(completion, self.fallback)
        if extracted is None:
            return RewardResult(0.0, {"answer_found": 0.0, "boxed": 0.0, "extracted": None})
        answer, how = extracted
        extras = {"answer_found": 1.0, "boxed": float(how == "boxed"), "extracted": answer}
        try:
            correct = self.sandbox.call(_equivalent, answer, reference, timeout_s=self.timeout_s)
        except SandboxTimeout as e:
            raise RewardTimeout(f"math-verify on {answer[:80]!r}: {e}") from e
        return RewardResult(float(correct), extras)

    def close(self) -> None:
        self.sandbox.close()
