"""The shared-prompt pass hands the decoder its KV cache under the keyword the decoder's signature
takes, and fails loudly when the cache stayed empty: a keyword swallowed by **kwargs (as
transformers 5.17 swallowed `cache=`) would let the completions attend to nothing of their
prompt, and the log-probs would be wrong without an error."""

import pytest
from test_actor_shared_prompt import GROUPS, group_batch
from tiny_lm import tiny_causal_lm
from torch import nn

from sparrow.rl.shared_prompt_passes import cache_keyword, group_shared_hidden


class IgnoresPastKeyValues(nn.Module):
    """Names `past_key_values` in its signature but runs the real decoder without it."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder
        self.config = decoder.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                **kwargs):  # fmt: skip
        return self.decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )


class IgnoresCache(IgnoresPastKeyValues):
    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, **kwargs):
        return super().forward(input_ids, attention_mask, position_ids)


class OnlyKwargs(IgnoresPastKeyValues):
    def forward(self, input_ids, **kwargs):
        return self.decoder(input_ids=input_ids, attention_mask=kwargs.get("attention_mask"))


def _run(decoder):
    batch = group_batch(GROUPS, seed=3)
    args = (batch["input_ids"], batch["attention_mask"].long(), batch["prompt_lens"])
    return group_shared_hidden(decoder, *args, batch["group_ids"])


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_installed_decoder_fills_the_cache(family):
    decoder = tiny_causal_lm(family).get_decoder()
    assert cache_keyword(decoder) in ("past_key_values", "cache")
    shared = _run(decoder)
    assert shared.hidden.shape[0] == len(GROUPS[0][1]) + len(GROUPS[1][1])


@pytest.mark.parametrize("wrapper", [IgnoresPastKeyValues, IgnoresCache])
def test_ignored_cache_fails_loudly(wrapper):
    decoder = wrapper(tiny_causal_lm("qwen3").get_decoder())
    with pytest.raises(RuntimeError, match="did not fill the KV cache"):
        _run(decoder)


def test_decoder_without_a_cache_keyword_is_refused():
    decoder = OnlyKwargs(tiny_causal_lm("qwen3").get_decoder())
    with pytest.raises(TypeError, match="neither `past_key_values` nor `cache`"):
        _run(decoder)
