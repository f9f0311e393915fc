"""Multi-turn environments: the protocol, loading one by name, and the tokens of each turn.

An environment is built per prompt row by a factory, `make_env(row) -> Environment`; the row is a
dict with the row's user message under "prompt", its reference answer under "answer" and the
source row's other columns. `reset()` gives the episode's first messages; `step(text)` takes the
assistant's turn as decoded text and returns an `Observation`: the messages to append (tool
results), whether the episode is done, and this turn's reward. An episode's reward is the SUM of
its turns' rewards (most environments give 0 until the last turn).

    env.function=path/to/file.py:make_env     # a file, from the current directory
    env.function=package.module:make_env      # an importable module
    env.function=calculator                   # a built-in (envs/): calculator, python

Token-in, token-out: the trainer trains on exactly the tokens the engine sampled. The prompt is
rendered once (`first_prompt_ids`); after each assistant turn, whose last token is the end token
the model sampled itself (`<|im_end|>`), `observation_ids` renders only the new messages, as the
chat template would place them after an assistant turn, and never re-renders earlier turns (a
template that strips earlier `<think>` blocks would otherwise change tokens already sampled).
"""

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sparrow.tasks.tool_calls import tool_system_prompt

KEY = "env.function"
# Built-in environments by name (sparrow/tasks/envs/).
BUILTIN_ENVS = {
    "calculator": "sparrow.tasks.envs.calculator:make_env",
    "python": "sparrow.tasks.envs.python_tool:make_env",
}
TRUNCATION_MARKER = "\n[... {n} tokens cut]"
# The assistant turn rendered before the observation, found again by this text and then cut.
_ANCHOR = "sparrow-anchor-7f3c"


@dataclass
class Observation:
    """What the environment says after one assistant turn."""

    messages: list[dict]  # chat messages to append (role "tool" for tool results, or "user"); []
    done: bool  # the episode ends after this assistant turn
    reward: float = 0.0  # this turn's reward; an episode's reward is the SUM over its turns
    tool_calls: int = 0  # tool calls parsed in this assistant turn
    tool_errors: int = 0  # of those, failed (malformed, raised, timed out, too big, non-text)


class Environment(Protocol):
    tools: list[dict]  # JSON schemas of the tools, handed to the chat template's tools=

    def reset(self) -> list[dict]:
        """The episode's first messages (system/user)."""
        ...

    def step(self, assistant_text: str) -> Observation:
        """The observation after the assistant's turn (its decoded text, end token excluded)."""
        ...


EnvFactory = Callable[[dict], Environment]  # built per prompt row


class EnvSpecError(ValueError):
    """The environment named by env.function cannot be used; str() is one line naming it."""


def load_env_factory(spec: str) -> EnvFactory:
    """The factory `spec` names: a built-in name, path/to/file.py:FN or package.module:FN."""
    from sparrow.tasks.user_reward import RewardFunctionError, import_source

    target = BUILTIN_ENVS.get(spec, spec)
    source, _, name = target.rpartition(":")
    if not source or not name.isidentifier():
        raise EnvSpecError(
            f"{KEY}={spec!r}: expected a built-in ({', '.join(BUILTIN_ENVS)}), "
            "path/to/file.py:FUNCTION or package.module:FUNCTION"
        )
    try:
        module = import_source(source, spec, KEY)
    except RewardFunctionError as err:
        raise EnvSpecError(str(err)) from None
    factory = getattr(module, name, None)
    if factory is None:
        defined = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        close = difflib.get_close_matches(name, defined, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"it defines {sorted(defined)[:8]}"
        raise EnvSpecError(f"{KEY}={spec!r}: {source} has no {name!r}; {hint}")
    if not callable(factory):
        raise EnvSpecError(f"{KEY}={spec!r}: {name} is a {type(factory).__name__}, not callable")
    try:
        inspect.signature(factory).bind({})
    except TypeError as err:
        raise EnvSpecError(
            f"{KEY}={spec!r}: {name}{inspect.signature(factory)} cannot be called as "
            f"{name}(row) ({err}); an environment factory takes the prompt row (a dict)"
        ) from None
    except ValueError:  # a builtin without a signature: the guard counts what fails
        pass
    return factory


def check_env_function(spec: str | None) -> None:
    """Raise EnvSpecError (one line) if `spec` cannot be used; None is single-turn, fine."""
    if spec:
        load_env_factory(spec)


def render_tools(tokenizer, messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages`, with the tools described in a system message when the chat template does not
    render `tools=` itself (SmolLM2's ChatML does not; Qwen2.5/Qwen3's do)."""
    if not tools:
        return messages
    plain = tokenizer.apply_chat_template(messages, tokenize=False)
    if tokenizer.apply_chat_template(messages, tools=tools, tokenize=False) != plain:
        return messages
    described = tool_system_prompt(tools)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{described}")
        return [first, *messages[1:]]
    return [{"role": "system", "content": described}, *messages]


def first_prompt_ids(tokenizer, messages: list[dict], tools: list[dict]) -> list[int]:
    """The episode's prompt: its first messages with the tools, and the generation prompt."""
    messages = render_tools(tokenizer, messages, tools)
    kwargs = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **kwargs
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def observation_text(tokenizer, messages: list[dict], end_token: str | None = None) -> str:
    """The text the chat template puts after an assistant turn's end token for `messages`,
    ending with the next assistant turn's generation prompt.

    The template renders [user, assistant(anchor), *messages]; what follows the end token after
    the anchor is kept. Nothing before it is reused, so how the template renders (or strips)
    earlier turns does not matter. `end_token`: the token that closes an assistant turn (default:
    the first special token after the anchor, else the tokenizer's eos)."""
    context = [
        {"role": "user", "content": "."},
        {"role": "assistant", "content": _ANCHOR},
        *messages,
    ]
    text = tokenizer.apply_chat_template(context, add_generation_prompt=True, tokenize=False)
    at = text.find(_ANCHOR)
    if at < 0:
        raise ValueError("the chat template does not render an assistant message's content")
    after = text[at + len(_ANCHOR) :]
    end = end_token or _end_token(tokenizer, after)
    cut = after.find(end)
    if cut < 0:
        raise ValueError(f"the chat template does not close an assistant turn with {end!r}")
    return after[cut + len(end) :]


def _end_token(tokenizer, after_anchor: str) -> str:
    stripped = after_anchor.lstrip(" ")
    specials = sorted(tokenizer.all_special_tokens, key=len, reverse=True)
    for token in specials:
        if token and stripped.startswith(token):
            return token
    if tokenizer.eos_token is None:
        raise ValueError("the tokenizer has no eos token and the template no end-of-turn token")
    return tokenizer.eos_token


def observation_ids(
    tokenizer,
    messages: list[dict],
    max_tokens: int | None = None,
    end_token: str | None = None,
) -> list[int]:
    """The observation's tokens, to append after the assistant's sampled end token; with
    `max_tokens`, message contents are cut (a marker says how much) to fit."""
    return capped_observation_ids(tokenizer, messages, max_tokens, end_token)[0]


def capped_observation_ids(
    tokenizer,
    messages: list[dict],
    max_tokens: int | None,
    end_token: str | None = None,
) -> tuple[list[int], int]:
    """(tokens, tokens cut from the contents). The template's own tokens (role headers, the
    generation prompt) are kept whole: if they alone are over `max_tokens`, every content is cut
    to its marker and the result is still over (the caller's context limit ends the episode)."""

    def ids(msgs: list[dict]) -> list[int]:
        text = observation_text(tokenizer, msgs, end_token)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    whole = ids(messages)
    if max_tokens is None or len(whole) <= max_tokens:
        return whole, 0
    contents = [tokenizer(m["content"], add_special_tokens=False)["input_ids"] for m in messages]
    total = sum(len(c) for c in contents)
    frame = len(whole) - total  # the template's own tokens, kept whole
    marker = len(
        tokenizer(TRUNCATION_MARKER.format(n=total), add_special_tokens=False)["input_ids"]
    )
    budget = max_tokens - frame - marker * len(messages)
    for _ in range(8):  # a cut can change how the text around it merges: retry a little shorter
        keep = _shares([len(c) for c in contents], max(0, budget))
        cut = [
            dict(m, content=_cut_content(tokenizer, c, k)) if k < len(c) else m
            for m, c, k in zip(messages, contents, keep, strict=True)
        ]
        result = ids(cut)
        if len(result) <= max_tokens or budget <= 0:
            break
        budget -= len(result) - max_tokens
    return result, total - sum(keep)


def _shares(lengths: list[int], budget: int) -> list[int]:
    """Tokens kept per content: the short ones whole, the long ones an equal share of the rest."""
    keep = [0] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for rank, i in enumerate(order):
        share = budget // (len(lengths) - rank)
        keep[i] = min(lengths[i], share)
        budget -= keep[i]
    return keep


def _cut_content(tokenizer, content_ids: list[int], keep: int) -> str:
    head = tokenizer.decode(content_ids[:keep], skip_special_tokens=False)
    return head + TRUNCATION_MARKER.format(n=len(content_ids) - keep)


def describe(value: Any) -> str:
    """A value's kind for an error message: its type, and a length where it has one."""
    size = f" of {len(value)} items" if isinstance(value, (list, tuple, dict)) else ""
    return f"{type(value).__name__}{size}"
