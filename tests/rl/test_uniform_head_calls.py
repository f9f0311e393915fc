"""Under ZeRO-3 every lm_head call gathers its weight, a collective: ranks whose micro-batches
differ in length (so in log-prob chunks) must still call the head as often as each other, or
their gathers pair up wrongly (a hang, or another module's weights).

Two gloo ranks score batches of different lengths through PolicyWithLogprobs with 4-token chunks
(no DeepSpeed: the head's forward calls are counted with a hook) and compare counts; with
`uniform_head_calls` they agree and the scores equal the rank's own unpadded scoring.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hang_guard import HANG_GUARD_S
from test_distributed import clean_env, free_port

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    sys.path.insert(0, "tests")
    from tiny_lm import grouped_batch, tiny_causal_lm, VOCAB
    from sparrow.rl.policy_logprobs import PolicyWithLogprobs

    rank, uniform = int(sys.argv[1]), sys.argv[2] == "1"
    dist.init_process_group("gloo", rank=rank, world_size=2)
    gen = torch.Generator().manual_seed(rank)
    prompts = [torch.randint(1, VOCAB, (5 + 6 * rank,), generator=gen)]
    batch = grouped_batch(prompts, [[3, 4 + 8 * rank]], gen)  # rank 1: longer prompt and rows
    policy = PolicyWithLogprobs(tiny_causal_lm("qwen3"), chunk_tokens=4)
    calls = []
    policy.lm.get_output_embeddings().register_forward_hook(lambda *a: calls.append(1))
    args = (batch["input_ids"], batch["attention_mask"], 3, 1.0)
    groups = (batch["prompt_lens"], batch["group_ids"])
    with torch.no_grad():
        alone = policy(*args, *groups)
    policy.uniform_head_calls = uniform
    calls.clear()
    scores = policy(*args, *groups)
    scores[0].sum().backward()  # the checkpointed chunks call the head again
    for a, b in zip(alone, scores):
        assert torch.allclose(a.float(), b.float(), atol=1e-6), "scores changed"
    counts = [None, None]
    dist.all_gather_object(counts, len(calls))
    print("counts", counts[0], counts[1])
    dist.destroy_process_group()
    """
)


def head_calls(uniform: bool) -> tuple[int, int]:
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(rank), str(int(uniform))],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=HANG_GUARD_S) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    _, a, b = outs[0][0].split()
    return int(a), int(b)


def test_ranks_call_the_head_equally_often():
    a, b = head_calls(uniform=False)
    assert a != b  # the lengths really give the ranks different chunk counts
    a, b = head_calls(uniform=True)
    assert a == b
