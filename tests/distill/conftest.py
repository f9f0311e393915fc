"""Session fixtures of the DistillSparse tests (one tokenizer, one Llama rollout)."""

import pytest
from sparse_rollouts import SparseRollout, make_rollout

from sparrow.models.loading import tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def llama_rollout(tokenizer) -> SparseRollout:
    return make_rollout(tokenizer, "llama")
