"""Child process of test_bench_device.py: every `sparrow-bench` subcommand with a GPU planted.

Run with TRITON_INTERPRET unset. Before anything of sparrow is imported, `torch.cuda.is_available`
says True; then for each subcommand (sparrow.bench.cli.COMMANDS):
1. its module imports without switching the Triton interpreter on (kernels would not compile);
2. its argument parser chooses CUDA;
3. what it builds (weights, engine, KV cache, inputs) is built on the chosen device. A CPU-only
   torch cannot hold CUDA tensors, so the chosen device stands in as `meta` here: a device that
   is not the CPU, on which building works (no values). Mixing a CPU tensor into an op on meta
   tensors raises, and afterwards every tensor the build holds is walked: none may be on the CPU.
   Harness fake: the meta device has no random generator, so the engine's sampler gets a CPU one
   (a build draws nothing).
Prints one JSON line: {subcommand: {"imports_interpreted": bool, "device": str, "cpu_tensors":
[paths], "build": "ok" | error}}.
"""

import argparse
import dataclasses
import importlib
import json
import os
import sys
import traceback

import torch

from sparrow.bench.device import load_on_device

torch.cuda.is_available = lambda: True  # the planted GPU, before sparrow reads it

META = torch.device("meta")  # the chosen device's stand-in
_generator = torch.Generator


def _generator_without_meta(device=None):
    return _generator() if torch.device(device or "cpu").type == "meta" else _generator(device)


def cpu_tensors(root, name: str = "state", limit: int = 200_000) -> list[str]:
    """Paths of every CPU tensor reachable from `root` (attributes, items, module state)."""
    found, seen, stack = [], set(), [(name, root)]
    while stack and len(seen) < limit:
        path, obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cpu":
                found.append(f"{path} {tuple(obj.shape)}")
            continue
        if isinstance(obj, torch.nn.Module):
            stack += [(f"{path}.{k}", v) for k, v in obj.state_dict(keep_vars=True).items()]
        if isinstance(obj, dict):
            stack += [(f"{path}[{k!r}]", v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple, set)):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
        elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
            if type(obj).__module__.split(".")[0] not in ("sparrow", "transformers", "peft"):
                continue  # torch, tokenizers, ...: not the bench's state
            attrs = dict(getattr(obj, "__dict__", {}))
            for slot in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, slot):
                    attrs[slot] = getattr(obj, slot)
            stack += [(f"{path}.{k}", v) for k, v in attrs.items()]
    return found


def build(name: str, module, args):
    """What subcommand `name` builds before its first step, on `args.device`."""
    if name == "decode":  # its runner comes from random_runner.py, built on args.device
        from sparrow.bench import random_runner

        config = random_runner.qwen3_1p7b_shaped(args.hidden, args.vocab, args.triton_layers)
        return random_runner.runner_with_prompts(
            config, torch.bfloat16, "triton", args.triton_lens, device=args.device
        )
    if name == "decode-step":
        bench = module.build(args)
        return bench, module.sequences(bench, args.batches[0], args.samples, args.context)
    if name == "kernel":
        return module.build_layer(args, args.contexts[0], args.device)
    if name == "kernel-check":  # one dtype's comparison inputs: the rows, the paged batch
        case = module.build_case(args, module.random_model_config(args.model), "bfloat16", False)
        return case, module.paged_batch(case)
    if name in ("rollout", "prefix", "speculative"):
        from sparrow.rollout.engine import EngineConfig, LLMEngine

        loaded = load_on_device(args)
        cfg = EngineConfig(num_pages=64, dtype=args.dtype, linear_backend=args.linear_backend)
        return loaded, LLMEngine(loaded.model, loaded.tokenizer, cfg)
    if name == "dense-shared":  # one loaded model, an engine per arm (fused kernel, copies)
        from sparrow.rollout.engine import LLMEngine

        loaded = load_on_device(args)
        engines = [
            LLMEngine(loaded.model, loaded.tokenizer, module._engine_config(args, shared))
            for shared in module.ARMS.values()
        ]
        return loaded, engines
    if name == "distill-attention":
        return module._build(128, 64, args.device)
    if name == "actor":  # what both measurements build: the batch and the model (DeepSpeed aside)
        batch = module.grouped_batch(1, 2, 0, 8, 8, module.MEMORY_VOCAB, args.device)
        return batch, module.memory_model(args.device)
    if name in ("step", "pipeline"):
        return None  # builds nothing itself: the trainer places everything (CUDA when present)
    if name == "push":
        return None  # builds in the torchrun ranks it starts, on the CPU (gloo) by design
    raise KeyError(f"no build for subcommand {name!r}: add one to {__file__}")


TINY = {  # arguments that keep each build small
    "actor": ["memory", "2", "0"],
    "decode": ["--triton-layers", "3"],
    "decode-step": [],
    "kernel": ["--contexts", "64", "--budgets", "32", "--batch", "2"],
    "rollout": ["--model", "tiny-qwen3", "--quick"],
    "prefix": ["--model", "tiny-qwen3", "--quick"],
    "speculative": ["--model", "tiny-qwen3", "--quick"],
    "kernel-check": ["--rows", "2"],
    "dense-shared": ["--model", "tiny-qwen3", "--context", "40", "--samples", "2"],
    "distill-attention": [],
    "step": [],
    "pipeline": [],
    "push": [],
}


def main() -> int:
    from sparrow.bench.cli import COMMANDS

    report = {}
    for name, module_name in COMMANDS.items():
        entry = report[name] = {}
        module = importlib.import_module(module_name)
        entry["imports_interpreted"] = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        parsed = module.parse_args(TINY[name])
        args = parsed[0] if isinstance(parsed, tuple) else parsed  # step: (args, overrides)
        entry["device"] = str(args.device)
        try:
            torch.Generator = _generator_without_meta
            state = build(name, module, argparse.Namespace(**{**vars(args), "device": META}))
            entry["cpu_tensors"] = cpu_tensors(state)
            entry["build"] = "ok"
        except Exception as err:  # reported to the test, with where it happened
            entry["build"] = f"{type(err).__name__}: {err} at {traceback.format_exc(limit=-2)}"
        finally:
            torch.Generator = _generator
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
