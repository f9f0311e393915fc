"""The host a run ran on, as far as its CPU float results depend on it: `host.json` in the run dir.

A seeded run repeats to the byte on one host and parts from step 1 on another: oneDNN, MKL and
ATen pick their kernels by the CPU's instruction sets (AVX2, AVX-512, AVX512-BF16, AMX) and the
thread count, and each kernel sums in its own order, so the last bits of a log-prob differ;
sampling turns a last-bit difference into another token within a few steps. The fingerprint
holds what picks those kernels: the CPU (vendor, family/model/stepping, the ISA flags they
dispatch on), the torch build, its oneDNN and MKL versions, ATen's CPU capability and the
intra-op thread count. Two runs whose fingerprints are equal are expected to be equal (that
is what tests/experiments/test_default_run.py holds the committed default run to); a differing
fingerprint says nothing about the size of the difference.

    python -m sparrow.train.run.host    # this process's fingerprint, as JSON

Every launch in a run dir appends its fingerprint and the step it started from (rank 0's host),
so a run resumed on another host says so.
"""

import argparse
import json
import platform
import re
import sys
from pathlib import Path

FILE_NAME = "host.json"
# The CPU flags (Linux /proc/cpuinfo names) that oneDNN, MKL and ATen choose kernels by.
KERNEL_ISA = frozenset(
    {
        *("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512dq"),
        *("avx512cd", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16"),
        *("amx_tile", "amx_bf16", "amx_int8", "amx_fp16"),
        *("asimd", "asimddp", "sve", "sve2", "bf16", "i8mm"),  # aarch64's Features line
    }
)


def _cpuinfo(text: str) -> dict:
    """vendor, family/model/stepping, model name and the kernel ISA flags of the first CPU."""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    ident = [fields.get(k, "?") for k in ("vendor_id", "cpu family", "model", "stepping")]
    return {
        "cpu": f"{ident[0]} family {ident[1]} model {ident[2]} stepping {ident[3]}",
        "cpu_name": fields.get("model name", platform.processor() or "?"),
        "isa": sorted(flags & KERNEL_ISA),
    }


def _library_version(config: str, pattern: str) -> str | None:
    found = re.search(pattern, config)
    return found.group(1) if found else None


def host_fingerprint() -> dict:
    """This process's fingerprint (its thread count included: set OMP_NUM_THREADS first)."""
    import torch

    try:
        cpu = _cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux: the platform's words, no flags
        cpu = {"cpu": platform.processor() or "?", "cpu_name": platform.platform(), "isa": []}
    config = torch.__config__.show()
    return {
        "machine": platform.machine(),
        **cpu,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn": _library_version(config, r"MKL-DNN (v[\d.]+)"),
        "mkl": _library_version(config, r"Math Kernel Library Version ([\w.]+)"),
        "threads": torch.get_num_threads(),
    }


def record_host(run_dir: Path, from_step: int, fingerprint: dict | None = None) -> None:
    """Append this launch's fingerprint to run_dir/host.json."""
    path = Path(run_dir) / FILE_NAME
    launches = json.loads(path.read_text())["launches"] if path.exists() else []
    entry = {"from_step": from_step, "fingerprint": fingerprint or host_fingerprint()}
    path.write_text(json.dumps({"launches": [*launches, entry]}, indent=1) + "\n")


def run_host(run_dir: Path) -> dict | None:
    """The fingerprint of the host the whole run ran on; None when host.json is missing (a run
    older than it) or its launches ran on different hosts."""
    path = Path(run_dir) / FILE_NAME
    if not path.exists():
        return None
    prints = [launch["fingerprint"] for launch in json.loads(path.read_text())["launches"]]
    return prints[0] if prints and all(p == prints[0] for p in prints) else None


def describe(fingerprint: dict) -> str:
    """One line for a table: the CPU, its widest kernel ISA, torch and the threads."""
    isa = fingerprint["isa"]
    widest = [f for f in ("amx_bf16", "avx512_bf16", "avx512_vnni", "avx512f", "avx2") if f in isa]
    return (
        f"{fingerprint['cpu']} ({widest[0] if widest else 'no AVX2'}), torch "
        f"{fingerprint['torch']} {fingerprint['cpu_capability']}, oneDNN {fingerprint['onednn']}, "
        f"{fingerprint['threads']} threads"
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m sparrow.train.run.host`: this host's fingerprint as JSON on stdout."""
    parser = argparse.ArgumentParser(
        prog="python -m sparrow.train.run.host", description=main.__doc__
    )
    parser.parse_args(argv)
    json.dump(host_fingerprint(), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
