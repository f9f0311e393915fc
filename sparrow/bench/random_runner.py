"""A model runner over random weights with a real model's attention shapes, prefilled and ready
to decode: what the decode benchmarks and the decode-path tests build on. Random HF-named weights
stand in for the HF module, whose init costs ~30 s for 28 layers on 2 cores."""

import torch

from sparrow.bench.device import bench_device, interpret_triton_without_cuda, seeded

interpret_triton_without_cuda()  # before anything imports triton

import transformers  # noqa: E402

from sparrow.models.shape import ModelShape  # noqa: E402
from sparrow.rollout.block_manager import BlockManager  # noqa: E402
from sparrow.rollout.linear import Linear  # noqa: E402
from sparrow.rollout.model_runner import ModelRunner  # noqa: E402
from sparrow.rollout.paged_attention import SparseAttentionConfig  # noqa: E402
from sparrow.rollout.sequence import Sequence  # noqa: E402


def qwen3_1p7b_shaped(hidden: int = 64, vocab: int = 256, layers: int = 28):
    """Qwen3-1.7B's attention shapes (16 q / 8 KV heads, head dim 128, 28 layers) around a small
    hidden size and vocabulary."""
    return transformers.Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        # Taken by **kwargs into rope_parameters, which the config's signature does not show.
        rope_theta=1_000_000.0,  # type: ignore[call-arg]
    )


class RandomWeights:
    """What ModelRunner reads from an HF model (config, state_dict, parameters), with random
    HF-named weights made on `device`: building the HF module of a 28-layer model costs ~30 s of
    init on 2 cores."""

    def __init__(
        self,
        config,
        seed: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        self.config = config
        device = torch.device(device)
        s = ModelShape.from_hf_config(config)
        h, d, inter = s.hidden_size, s.head_dim, s.intermediate_size
        q, kv = s.num_q_heads * d, s.kv_dim

        def w(*shape, scale=0.02):
            return torch.randn(shape, device=device, dtype=dtype).mul_(scale)

        with seeded(device, seed):
            self._state = {
                "model.embed_tokens.weight": w(s.vocab_size, h),
                "model.norm.weight": 1 + w(h),
            }
            for i in range(s.num_layers):
                p = f"model.layers.{i}."
                self._state.update({
                    p + "input_layernorm.weight": 1 + w(h),
                    p + "post_attention_layernorm.weight": 1 + w(h),
                    p + "self_attn.q_proj.weight": w(q, h, scale=h**-0.5),
                    p + "self_attn.k_proj.weight": w(kv, h, scale=h**-0.5),
                    p + "self_attn.v_proj.weight": w(kv, h, scale=h**-0.5),
                    p + "self_attn.o_proj.weight": w(h, q),
                    p + "self_attn.q_norm.weight": 1 + w(d),
                    p + "self_attn.k_norm.weight": 1 + w(d),
                    p + "mlp.gate_proj.weight": w(inter, h),
                    p + "mlp.up_proj.weight": w(inter, h),
                    p + "mlp.down_proj.weight": w(h, inter),
                })  # fmt: skip
            if not getattr(config, "tie_word_embeddings", True):
                self._state["lm_head.weight"] = w(s.vocab_size, h)

    def state_dict(self) -> dict:
        return self._state

    def parameters(self):
        return iter(self._state.values())


def prefilled_runner(
    config,
    dtype: torch.dtype,
    backend: str,
    prompt_lens: list[int],
    *,
    page_size: int = 16,
    seed: int = 0,
    weights: RandomWeights | None = None,
    cuda_graphs: bool = False,
    device: torch.device | str | None = None,
) -> tuple[ModelRunner, list[Sequence], BlockManager]:
    """A runner over a random model (`weights`, else new ones for `config`) with one sequence per
    prompt length, prefilled (summaries kept current) and ready for its first decode step. On
    `device` (default: the weights', else `bench_device()`)."""
    runner, seqs, bm = runner_with_prompts(
        config, dtype, backend, prompt_lens, page_size=page_size, seed=seed, weights=weights,
        cuda_graphs=cuda_graphs, device=device,
    )  # fmt: skip
    advance(seqs, bm, runner.prefill([[s] for s in seqs], update_summaries=True))
    return runner, seqs, bm


def runner_with_prompts(
    config,
    dtype: torch.dtype,
    backend: str,
    prompt_lens: list[int],
    *,
    page_size: int = 16,
    seed: int = 0,
    weights: RandomWeights | None = None,
    cuda_graphs: bool = False,
    device: torch.device | str | None = None,
) -> tuple[ModelRunner, list[Sequence], BlockManager]:
    """`prefilled_runner` before its prefill: the runner, and the sequences with their pages."""
    if device is None:
        device = next(weights.parameters()).device if weights is not None else bench_device()
    model = weights or RandomWeights(config, seed, device)
    num_pages = sum(-(-(n + 64) // page_size) for n in prompt_lens)
    attn = SparseAttentionConfig(page_size=page_size, backend=backend)
    linear = Linear("torch", batch_hint=1)
    graphs = {"cuda_graphs": True} if cuda_graphs else {}  # (runs against older runners too)
    runner = ModelRunner(model, attn, num_pages, dtype, linear, **graphs)
    bm = BlockManager(num_pages, page_size)
    gen = torch.Generator().manual_seed(seed)  # host token ids
    seqs = []
    for i, n in enumerate(prompt_lens):
        seq = Sequence(i, i, torch.randint(3, config.vocab_size, (n,), generator=gen).tolist(), 64)
        bm.allocate_prefill([seq])
        seqs.append(seq)
    return runner, seqs, bm


def advance(seqs: list[Sequence], bm: BlockManager, logits: torch.Tensor) -> None:
    """Append each sequence's greedy token and give it a page when it needs one."""
    for seq, token in zip(seqs, logits.argmax(-1).tolist(), strict=True):
        seq.completion_ids.append(token)
        if bm.needs_page(seq):
            bm.append_page(seq)
