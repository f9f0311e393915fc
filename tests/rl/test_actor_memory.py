"""The activation estimate the plan line states per actor micro-batch."""

from transformers import Qwen3Config

from sparrow.models.shape import ModelShape
from sparrow.rl.actor_memory import micro_batch_activation_bytes, micro_batch_decoder_tokens
from sparrow.train.step_report import actor_plan

QWEN3_1P7B = Qwen3Config(
    hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, vocab_size=151936,
)  # fmt: skip


def test_estimate_scales_with_tokens_and_checkpointing_cuts_it():
    shape = ModelShape.from_hf_config(QWEN3_1P7B)
    assert shape.kv_dim == 8 * 128 and shape.num_layers == 28

    def gib(tokens, ckpt):
        return micro_batch_activation_bytes(shape, tokens, ckpt, 1024) / 2**30

    # Linear in tokens past the fixed logits chunk.
    assert gib(65536, True) - gib(32768, True) == gib(32768, True) - gib(0, True)
    # A group of 8 x 16K tokens whole, without checkpointing, cannot fit one H200 (141 GB) ...
    assert gib(8 * 16384, False) > 141
    # ... a 32K-token micro-batch with checkpointing leaves room for weights and AdamW states.
    assert 5 < gib(32768, True) < 30


def test_plan_line_states_the_micro_batch_and_its_estimate():
    from sparrow.cli.config_loader import load_config

    cfg = load_config(["preset=qwen3_1p7b_gpu"])
    line = actor_plan(cfg, QWEN3_1P7B)
    # The longest row (8192-token prompt + 32768 new tokens) exceeds the budget and runs alone.
    assert "<= 40960 tokens (token budget 32768; the longest row runs alone)" in line
    assert "checkpointing on" in line
    assert "GiB each" in line


def test_rows_are_counted_as_the_actor_runs_them():
    # 8 groups of 6 rows: prompts once per group, completions per row ...
    assert micro_batch_decoder_tokens(48, 6, 385, 32, share_prefix=False) == 8 * 385 + 48 * 32
    # ... the 340-token prefix common to all prompts once per micro-batch ...
    assert micro_batch_decoder_tokens(48, 6, 385, 32, 340) == 340 + 8 * 45 + 48 * 32
    # ... every row whole without shared prompts; a micro-batch cut inside groups has 2 halves.
    assert micro_batch_decoder_tokens(48, 6, 385, 32, 340, share_prompts=False) == 48 * 417
    assert micro_batch_decoder_tokens(4, 6, 100, 10, share_prefix=False) == 2 * 100 + 4 * 10


def test_plan_line_sizes_rows_from_the_dataset_not_the_prompt_limit():
    from sparrow.cli.config_loader import load_config

    cfg = load_config([])  # the CPU default: micro-batches of 48 rows, prompts up to 4096 tokens
    small = Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=1000,
    )  # fmt: skip
    at_limit = actor_plan(cfg, small)
    from_data = actor_plan(cfg, small, 385, 340)
    tokens = micro_batch_decoder_tokens(48, cfg.rl.group_size, 385, cfg.rollout.max_new_tokens, 340)
    assert f"<= {tokens} tokens (48 rows at most)" in from_data
    assert f"<= {tokens} tokens" not in at_limit


def test_dataset_reports_longest_prompt_and_common_prefix():
    from sparrow.tasks.data import Prompt, PromptDataset

    def prompt(ids):
        return Prompt(0, "", ids, "", {})

    data = PromptDataset([prompt([1, 2, 3, 4]), prompt([1, 2, 5]), prompt([1, 2, 3, 9, 9])],
                         "test", "train", 3, 0, 10)  # fmt: skip
    assert data.prompt_lengths() == (5, 2)
    assert PromptDataset([prompt([7, 8])], "t", "train", 1, 0, 10).prompt_lengths() == (2, 2)
