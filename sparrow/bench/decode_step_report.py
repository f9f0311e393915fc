"""`sparrow-bench decode-step`'s report: what a run failed to do as asked and its printed rows
(sparrow/bench/decode_step.py fills the report and writes it)."""


def problems(report: dict) -> list[str]:
    """Why the report does not hold what was asked for (empty: it does)."""
    found = []
    for row in report["runs"]:
        name = f"batch {row['batch']}, graphs {'on' if row['graphs'] else 'off'}"
        for arm in ("sparse", "dense"):
            r = row[arm]
            if len(r["steps_ms"]) < report["iters"] or not r["step_ms"] > 0:
                found.append(f"{name}: the {arm} step was not timed")
            if row["graphs"] and r["graph_replays"] < report["iters"]:
                found.append(f"{name}: the {arm} step did not replay a CUDA graph")
            if r["jit_compiles_timed"]:
                found.append(
                    f"{name}: {r['jit_compiles_timed']} Triton compiles in timed {arm} steps"
                )
    found += [f"batch {e['batch']}: {e['error']}" for e in report.get("errors", [])]
    asked = len(report["batches"]) * len(report["graphs"])
    if len(report["runs"]) != asked:
        found.append(f"{len(report['runs'])} of {asked} configurations ran")
    return found


def print_row(row: dict) -> None:
    s, d = row["sparse"], row["dense"]
    print(
        f"batch {row['batch']:>3} ({row['prompts']} x {row['samples']}), graphs "
        f"{'on ' if row['graphs'] else 'off'}: sparse {s['step_ms']:8.3f} ms  dense "
        f"{d['step_ms']:8.3f} ms  dense/sparse {row['ratio']:5.2f}x",
        flush=True,
    )


def print_profile(rows: list[dict]) -> None:
    def share(r: dict) -> str:
        return "-" if r["host_share"] is None else f"{r['host_share']:.2f}"

    for row in rows:
        print(
            f"batch {row['batch']:>3}, graphs {'on ' if row['graphs'] else 'off'}: host share "
            f"sparse {share(row['sparse'])} dense {share(row['dense'])} (profiled)",
            flush=True,
        )
