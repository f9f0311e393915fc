"""Tiny random causal LMs, prompts and batches shared by the tests of several packages
(rollout, rl, monitor, train); pytest puts tests/ on the import path with tests/conftest.py."""

import torch
import transformers
from transformers import AutoModelForCausalLM

from sparrow.models.loading import tiny_model_config

VOCAB = 300


def tiny_causal_lm(
    family: str = "qwen3", seed: int = 0, tied: bool | None = None
) -> torch.nn.Module:
    """The tiny config with 2 layers and 300 ids, no padding row and RoPE base 1e4 (the model the
    actor tests' tolerances were measured on); every family but qwen3 ties its embeddings unless
    `tied` says otherwise. Biases (Qwen2's q/k/v) are random, not HF's zeros."""
    config = tiny_model_config(
        family,
        vocab_size=VOCAB,
        num_hidden_layers=2,
        max_position_embeddings=256,
        tie_word_embeddings=family != "qwen3" if tied is None else tied,
        pad_token_id=None,
        rope_theta=10_000.0,
    )
    torch.manual_seed(seed)
    return random_biases(AutoModelForCausalLM.from_config(config).eval())


def random_biases(model: torch.nn.Module, std: float = 0.5) -> torch.nn.Module:
    """Draw every bias (HF initialises them to 0, where dropping one would go unseen) from the
    global generator; a bias-free model is left as it is, its random stream untouched."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(std=std)
    return model


def rl_batch(num_seqs: int, seq_len: int, seed: int) -> dict[str, torch.Tensor]:
    """Right-padded sequences with a prompt, a completion and one advantage per sequence."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (num_seqs,), generator=gen)  # (B,)
    prompt_lens = torch.randint(2, seq_len // 2, (num_seqs,), generator=gen)  # (B,)
    positions = torch.arange(seq_len)[None, :]  # (1, T)
    attention_mask = positions < lengths[:, None]  # (B, T)
    completion_mask = attention_mask & (positions >= prompt_lens[:, None])  # (B, T)
    input_ids = torch.randint(0, VOCAB, (num_seqs, seq_len), generator=gen)  # (B, T)
    input_ids = torch.where(attention_mask, input_ids, 0)
    advantages = torch.randn(num_seqs, generator=gen)  # (B,)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "advantages": advantages,
    }


def grouped_batch(
    prompts: list[torch.Tensor], completion_lens: list[list[int]], gen, first_id: int = 0
) -> dict[str, torch.Tensor]:
    """Right-padded rows, consecutive per group: group g's rows share `prompts[g]` and get random
    completions of `completion_lens[g]` tokens (drawn from `gen` in row order, then one
    advantage per row); two columns of padding; group ids first_id, first_id + 1, ..."""
    rows = [(g, c) for g, lens in enumerate(completion_lens) for c in lens]
    width = max(len(prompts[g]) + c for g, c in rows) + 2
    ids = torch.zeros(len(rows), width, dtype=torch.int64)  # (B, T)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)  # (B, T)
    completion = torch.zeros(len(rows), width, dtype=torch.bool)  # (B, T)
    for r, (g, c) in enumerate(rows):
        p = len(prompts[g])
        ids[r, :p] = prompts[g]
        ids[r, p : p + c] = torch.randint(1, VOCAB, (c,), generator=gen)
        mask[r, : p + c] = True
        completion[r, p : p + c] = True
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "completion_mask": completion,
        "advantages": torch.randn(len(rows), generator=gen),  # (B,)
        "prompt_lens": torch.tensor([len(prompts[g]) for g, _ in rows]),  # (B,)
        "group_ids": torch.tensor([first_id + g for g, _ in rows]),  # (B,)
    }


def pg_loss_fn(global_tokens: int):
    """Policy-gradient loss normalised by the step's global completion-token count."""

    def loss_fn(new_logprobs, mb):
        mask = mb["completion_mask"].float()  # (b, T)
        loss = -(mb["advantages"][:, None] * new_logprobs * mask).sum() / global_tokens
        return loss, {"tokens_frac": mask.sum() / global_tokens}

    return loss_fn


def random_model(config: transformers.PretrainedConfig, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return random_biases(transformers.AutoModelForCausalLM.from_config(config).eval())


def random_prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    # Skip the special tokens (0..2 in the tiny tokenizer) so EOS is not in prompts.
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
