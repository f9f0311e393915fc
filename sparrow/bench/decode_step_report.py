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
        if report.get("speculative_k") and "speculative" not in row:
            found.append(f"{name}: the speculative arm's verify pass was not timed")
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
    spec = row.get("speculative")
    if spec is not None:
        ratios = " ".join(f"a {a}: {r:.2f}x" for a, r in spec["speedup_vs_dense"].items())
        print(
            f"  speculative k {spec['draft_tokens']}: verify {spec['step_ms']:8.3f} ms "
            f"({spec['verify_over_dense_step']:.2f} dense steps), over dense: {ratios}",
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
