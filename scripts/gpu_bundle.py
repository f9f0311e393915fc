"""The GPU check's bundle (scripts/gpu_check.sh writes it through this file; standard library
and, in `probe`, torch only): one JSON per stage with the commit stamp, the versions, and every
part's exit status, time and JSON, or why it was skipped.

    python3 scripts/gpu_bundle.py fingerprint [ROOT]   # what travels, as one hash (JSON line)
    python3 scripts/gpu_bundle.py stamp PATH COMMIT DIRTY   # gpu_wheels.sh's COMMIT file
    python3 scripts/gpu_bundle.py probe BUNDLE STAGE STAMP WORST_CASE_S BUDGET_S
    python3 scripts/gpu_bundle.py part BUNDLE NAME RC SECONDS CAP_S EXPECTED_S RESULT_PREFIX
    python3 scripts/gpu_bundle.py skip BUNDLE NAME CAP_S EXPECTED_S REASON
    python3 scripts/gpu_bundle.py finish BUNDLE SECONDS STATUS

`probe` is the stage's gate: without a CUDA device it prints one line on stderr and exits 3
before it writes anything (GPU_CHECK_ON_CPU=1 lets it go on, for the CPU rehearsal in the tests:
the bundle then says device "cpu" and scripts/gpu_results.sh refuses to file it).

The stamp: the device gets no .git, so the commit comes from the carried COMMIT file that
`scripts/gpu_wheels.sh --stamp` writes, and `fingerprint` ties both ends to the files that run:
the hash of every file under FOLDERS (path and git blob id, so a commit's `git ls-tree -r` gives
the same hash), taken when the stamp is written and again on the device. The bundle's stamp says
its source: the COMMIT file, and whether the tree that ran is the one it was written for; or, when
no COMMIT file came, the device's fingerprint alone, which scripts/gpu_results.sh matches against
the recent commits.
"""

import hashlib
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

FOLDERS = ("conf", "scripts", "sparrow", "tests")  # what a stage runs: code, configs, tests
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", "build", "outputs", "runs", "wandb"}
PACKAGES = ("torch", "triton", "transformers", "deepspeed", "hydra-core", "omegaconf",
            "math-verify", "gguf", "wandb")  # fmt: skip


def blob_id(data: bytes) -> str:
    """git's object id of a file's content (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fingerprint_of(entries: list[tuple[str, str]]) -> dict:
    """The hash of (path, blob id) pairs, whichever side listed them."""
    text = "".join(f"{path} {blob}\n" for path, blob in sorted(entries))
    return {"fingerprint": hashlib.sha256(text.encode()).hexdigest(), "files": len(entries),
            "folders": list(FOLDERS)}  # fmt: skip


def fingerprint(root: Path) -> dict:
    """FOLDERS' files under `root` as they lie (what git ignores in them and Python's caches left
    out), hashed as `fingerprint_of`."""
    entries = []
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(root / folder):
            dirnames[:] = [
                d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")
            ]
            for name in filenames:
                if name.endswith(".pyc"):
                    continue
                path = Path(dirpath) / name
                entries.append((path.relative_to(root).as_posix(), blob_id(path.read_bytes())))
    return fingerprint_of(entries)


def versions() -> dict:
    found = {"python": sys.version.split()[0]}
    for dist in PACKAGES:
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "missing"
    return found


def stamp_of(stamp_path: str, tree: dict) -> dict:
    """The carried stamp with its source, checked against the tree that runs."""
    try:
        stamp = json.loads(Path(stamp_path).read_text())
    except (OSError, ValueError) as e:
        return {"commit": None, "source": f"none: no COMMIT file at {stamp_path} "
                f"({type(e).__name__}); the device's fingerprint instead (gpu_results.sh matches "
                "it to a commit)", "tree": tree}  # fmt: skip
    source = f"{stamp_path} (scripts/gpu_wheels.sh --stamp, {stamp.get('stamped_at', '?')})"
    written_for = stamp.get("fingerprint")
    matches = None if written_for is None else written_for == tree["fingerprint"]
    return {**stamp, "source": source, "tree": tree, "tree_matches_stamp": matches}


def probe(bundle_path: str, stage: str, stamp_path: str, worst_case: str, budget: str) -> int:
    """The gate, then the bundle's head. Exit 3 (one line on stderr) without a CUDA device."""
    on_cpu = os.environ.get("GPU_CHECK_ON_CPU") == "1"
    found = versions()
    try:
        import torch

        cuda = torch.cuda.is_available()
        device = torch.cuda.get_device_name(0) if cuda else "cpu"
        why = "" if cuda else f"torch {torch.__version__} sees no CUDA device"
    except Exception as e:  # no torch, or a broken CUDA set-up: nothing here can run
        cuda, device, why = False, f"unknown ({type(e).__name__}: {e})", f"torch fails: {e}"
    if not cuda and not on_cpu:
        print(f"gpu_check {stage}: refused: {why}; run it on the GPU machine "
              "(GPU_CHECK_ON_CPU=1 only rehearses it on a CPU, and gpu_results.sh files no such "
              "bundle)", file=sys.stderr)  # fmt: skip
        return 3
    found["device"] = device
    stamp = stamp_of(stamp_path, fingerprint(Path.cwd()))
    bundle = {"stage": stage, "commit": stamp.get("commit"), "stamp": stamp, "versions": found,
              "on_cpu": not cuda, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "worst_case_s": int(worst_case), "budget_s": int(budget), "parts": []}  # fmt: skip
    Path(bundle_path).parent.mkdir(parents=True, exist_ok=True)
    Path(bundle_path).write_text(json.dumps(bundle, indent=1))
    print(json.dumps({"commit": bundle["commit"], "stamp": stamp["source"], **found}))
    return 0


def result_of(prefix: str):
    """A part's own JSON (PREFIX.json), or the counts and failed cases of its pytest JUnit XML
    (PREFIX.xml); None when it wrote neither."""
    data = None
    try:
        data = json.loads(Path(prefix + ".json").read_text())
    except (OSError, ValueError):
        pass
    try:
        suite = next(ET.parse(prefix + ".xml").getroot().iter("testsuite"))
        data = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        data["failed"] = [
            f"{c.get('classname')}::{c.get('name')}"
            for c in suite.iter("testcase")
            if c.find("failure") is not None or c.find("error") is not None
        ]
    except (OSError, ET.ParseError, StopIteration):
        pass
    return data


def add_part(bundle_path: str, record: dict) -> None:
    bundle = json.loads(Path(bundle_path).read_text())
    bundle["parts"].append(record)
    Path(bundle_path).write_text(json.dumps(bundle, indent=1))


def finish(bundle_path: str, seconds: str, status: str) -> None:
    """The end: time, status, and the versions again (the stage's install came after the probe)."""
    bundle = json.loads(Path(bundle_path).read_text())
    device = bundle["versions"].get("device")
    bundle["versions"] = versions() | {"device": device}
    bundle |= {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "seconds": int(seconds), "status": int(status)}  # fmt: skip
    Path(bundle_path).write_text(json.dumps(bundle, indent=1))


def write_stamp(path: str, commit: str, dirty: str) -> None:
    """The COMMIT file: the commit, whether tracked files differ from it, when, and the
    fingerprint of the files that travel (this tree as it lies)."""
    stamp = {"commit": commit, "dirty": dirty == "true",
             "stamped_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "fingerprint": fingerprint(Path("."))["fingerprint"]}  # fmt: skip
    Path(path).write_text(json.dumps(stamp) + "\n")


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "fingerprint" and len(args) <= 1:
        print(json.dumps(fingerprint(Path(args[0] if args else "."))))
    elif command == "stamp" and len(args) == 3:
        write_stamp(*args)
    elif command == "probe" and len(args) == 5:
        return probe(*args)
    elif command == "part" and len(args) == 7:
        path, name, rc, seconds, cap, expected, prefix = args
        add_part(path, {"name": name, "rc": int(rc), "seconds": int(seconds), "cap_s": int(cap),
                        "expected_s": int(expected), "result": result_of(prefix)})  # fmt: skip
    elif command == "skip" and len(args) == 5:
        path, name, cap, expected, reason = args
        record = {"name": name, "rc": None, "skipped": reason, "seconds": 0}
        add_part(path, record | {"cap_s": int(cap), "expected_s": int(expected), "result": None})
    elif command == "finish" and len(args) == 3:
        finish(*args)
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
