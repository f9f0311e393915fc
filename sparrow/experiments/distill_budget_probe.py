"""A saved DistillSparse adapter at budgets other than the one it was trained at.

For each fixed budget: held-out samples of the base sparse policy (phi = 0), then the exact
acceptance of those same tokens with and without the adapter (paired), per position bin. An
adapter trained at one budget corrects that budget's attention error; at a larger budget the
error is smaller and the same correction can overshoot, which this measures.

    python -m sparrow.experiments.distill_budget_probe --load-adapter runs/adapter_lr6e-4.pt \
        --budgets 4,5,6 --eval-prompts 32 --out runs/budget_probe.json   # ~5 min
"""

import json
import time
from pathlib import Path

import torch

from sparrow.experiments import distill_experiment as experiment


def main() -> None:
    parser = experiment.build_parser()  # the experiment's flags; its training is not run
    parser.add_argument("--budgets", required=True, help="fixed budgets (pages), comma list")
    args = parser.parse_args()
    if not args.load_adapter:
        parser.error("give --load-adapter: the adapter to compare with the base sparse policy")
    exp = experiment.Experiment(args)
    exp.distill.load_state_dict(torch.load(args.load_adapter, weights_only=False))
    start, result = time.perf_counter(), {"args": vars(args), "budgets": {}}
    for budget in experiment.pages_list(args.budgets):
        exp.sparse_schedule = lambda context_tokens, b=budget: b
        exp.use_adapter = False
        base = exp.evaluate()
        exp.use_adapter = True
        values, positions = exp.acceptance(base["prompts"], base["completions"])
        conditions = {
            "base": experiment.bins_table(
                "base", base["values"], base["positions"], args.bin_tokens
            ),
            "adapter_paired": experiment.bins_table(
                "adapter_paired", values, positions, args.bin_tokens
            ),
        }
        print(f"budget {budget} pages ({time.perf_counter() - start:.0f} s)")
        experiment.print_table(conditions)
        result["budgets"][budget] = {k: list(v.values()) for k, v in conditions.items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
