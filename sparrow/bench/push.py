"""`sparrow-bench push`: the weight push from a training rank to a rollout rank, timed per bucket
size, beside the colocated sync it replaces (the engine loading the trainer's state dict in the
same process).

    sparrow-bench push                                   # SmolLM2-135M, 2 local ranks (gloo)
    sparrow-bench push --bucket-mb 1 16 64 --repeats 5 --json push.json
    sparrow-bench push --device cuda --dtype bfloat16 --model qwen3-1.7b   # random weights, GPUs

It starts itself again under torchrun with two ranks on this host (sparrow/cluster.py's roles:
rank 0 trains, rank 1 rolls out); both load `--model`. Rank 0 first times the colocated sync on an
engine of its own, then, per bucket size, pushes the model `--repeats` times
(rollout/weight_push.py; the rollout rank's engine starts from zeros and is checked equal to the
sender's weights after the last). Prints one JSON object: the best push time per bucket size on
each side, the bytes and messages, and `push_vs_colocated`, the receiver's time over the
colocated load's (both copy the same bytes into an engine; the push adds the wire).
`--device cuda` puts each rank's model and engine on a GPU of this host: the push then runs over
NCCL when the host has two GPUs or more, and over gloo (through host memory) when both ranks
share one (cluster.push_backend=auto); the report's `push_backend` says which. GPU times are
taken after a device synchronize.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import torch

from sparrow.bench.device import load_bench_model


def parse_args(argv):
    p = argparse.ArgumentParser(prog="sparrow-bench push", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="a model sparrow loads, or a random_init shape (qwen3-1.7b: seeded random weights)",
    )
    p.add_argument("--dtype", default="float32", help="the engine's (and the push's) dtype")
    p.add_argument("--bucket-mb", type=float, nargs="+", default=[1.0, 16.0, 64.0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="each rank's")
    p.add_argument("--json", default=None, help="also write the JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "SPARROW_PUSH_BENCH_RANK" not in os.environ and "TORCHELASTIC_RUN_ID" not in os.environ:
        return _launch(argv)
    return _rank(parse_args(argv))


def _launch(argv: list[str]) -> int:
    """This bench again, as 2 torchrun ranks on this host."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(_free_port()), "-m", "sparrow.bench.push", *argv]
    env = dict(os.environ, SPARROW_PUSH_BENCH_RANK="1")
    if parse_args(argv).device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on the CPU even on a GPU host
    elif not torch.cuda.is_available():
        print("sparrow-bench push: --device cuda needs a GPU; none is visible", file=sys.stderr)
        return 2
    return subprocess.run(cmd, env=env).returncode


def _rank(args) -> int:
    from sparrow.cluster import local_device, split_world
    from sparrow.rl.actor import parameter_buckets
    from sparrow.rollout.engine import EngineConfig, LLMEngine
    from sparrow.rollout.weight_push import WeightPush

    roles = split_world(1, "gloo", timedelta(minutes=5))  # the push: cluster.push_backend=auto
    assert roles.push is not None
    args.device = local_device()  # the CPU, or this rank's GPU (the split made it current)
    torch.set_num_threads(args.threads)
    lm = _load(args)
    dtype = getattr(torch, args.dtype)
    engine = LLMEngine(lm.model, lm.tokenizer, EngineConfig(num_pages=64, dtype=args.dtype))
    report: dict = {"config": {k: str(v) for k, v in vars(args).items()}, "buckets": []}
    report["push_backend"] = roles.push_backend
    state = {k: v.detach() for k, v in lm.model.state_dict().items()}
    if roles.role == "train":
        report["colocated_s"] = _best(
            args.repeats, lambda: engine.update_weights(state), args.device
        )
    else:  # zeros first: the final check then shows the pushes' bytes, not the load's
        engine.update_weights({k: torch.zeros_like(v) for k, v in state.items()})
    for mb in args.bucket_mb:
        bucket = int(mb * 2**20)
        sides = []
        for _ in range(args.repeats):
            push = WeightPush(roles.push, 0, bucket, dtype)
            if roles.role == "train":
                sides.append(push.send(parameter_buckets(lm.model, bucket, dtype)))
            else:
                sides.append(push.receive(engine))
            _synchronize(args.device)  # every message has been read back to the host anyway
        best = min(sides, key=lambda s: s.seconds)
        remote = roles.bridge.gather_objects(best)
        report["buckets"].append(_row(mb, remote[0], remote[1]))
    if roles.role == "rollout":  # the last push left the sender's weights in this engine
        reference = LLMEngine(lm.model, lm.tokenizer, EngineConfig(num_pages=64, dtype=args.dtype))
        ok = all(torch.equal(a, b) for a, b in zip(_views(engine), _views(reference), strict=True))
        roles.bridge.gather_objects(ok)
        return 0
    equal = roles.bridge.gather_objects(None)[1]
    report["problems"] = [] if equal else ["the rollout rank's engine is not the sender's weights"]
    for row in report["buckets"]:
        row["push_vs_colocated"] = row["receive_s"] / report["colocated_s"]
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 1 if report["problems"] else 0


def _load(args):
    """`--model`: a random_init shape built on this rank's device (the same seed on both
    ranks), else loaded as every model bench loads it."""
    from sparrow.models.random_init import RANDOM_MODELS, build_random_model

    if args.model in RANDOM_MODELS:
        return build_random_model(args.model, getattr(torch, args.dtype), device=str(args.device))
    return load_bench_model(args)


def _row(mb: float, sent, received) -> dict:
    return {
        "bucket_mb": mb,
        "send_s": sent.seconds,
        "receive_s": received.seconds,
        "bytes": received.bytes,
        "messages": received.messages,
        "gb_per_s": received.bytes / received.seconds / 1e9,
    }


def _best(repeats: int, run, device: torch.device) -> float:
    best = float("inf")
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        run()
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _views(engine) -> list[torch.Tensor]:
    return list(engine.runner.model._parameter_views().values())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":  # a torchrun rank (_launch starts the module)
    sys.exit(main())
