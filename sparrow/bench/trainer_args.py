"""What the benches that build the trainer (step, pipeline) share: a parser whose flags come
first and whose other arguments are Hydra overrides, as for sparrow-train; and every bench's JSON
report file."""

import argparse
import json
from pathlib import Path

from sparrow.bench.device import bench_device
from sparrow.cli.errors import ArgumentParser


def trainer_parser(prog: str, doc: str) -> ArgumentParser:
    """`prog`'s parser with --json; `doc`: the bench module's docstring (its first paragraph is
    the description)."""
    p = ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog="Remaining arguments are Hydra overrides (key=value), as for sparrow-train.",
    )
    p.add_argument("--json", default=None, help="write the results as JSON here")
    return p


def parse_with_overrides(
    p: ArgumentParser, argv: list[str] | None
) -> tuple[argparse.Namespace, list[str]]:
    """(flags, Hydra overrides); anything else is an error. args.device: where the trainer
    builds (CUDA when present, GRPOTrainer's rule), which the bench's own choices follow."""
    args, rest = p.parse_known_args(argv)
    bad = [a for a in rest if "=" not in a and not a.startswith("~")]  # ~key: Hydra's delete
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    args.device = bench_device()
    return args, rest


def write_json(path: str | None, report: dict, announce: bool = True) -> None:
    """`report` as indented JSON at `path` (its folder made); nothing when `path` is None."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2) + "\n")
    if announce:
        print(f"wrote {path}", flush=True)
