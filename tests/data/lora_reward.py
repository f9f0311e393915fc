"""A reward the tiny random model can learn in a few steps (the LoRA RL learning test): the share of
the completion's characters that are digits. Dense (every sample scores in [0, 1]) and
unlike the arithmetic task's exact match, nonzero for a random policy."""


def digit_share(prompt: str, completion: str, reference: str) -> float:
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)
