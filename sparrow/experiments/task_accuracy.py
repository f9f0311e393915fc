"""Accuracy of a model on an embedded task (greedy and sampled), with 95% Wilson intervals, and
the prompt-length distribution of a task: the figures behind the default task's choice.

    python -m sparrow.experiments.task_accuracy --n 200 --temperatures 0 1
    python -m sparrow.experiments.task_accuracy --task long_context --lengths-only --n 1000
"""

import argparse
import statistics

from sparrow.models.loading import ModelConfig, load_model
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.tasks.data import DataConfig, load_prompts
from sparrow.tasks.generators import TaskConfig
from sparrow.tasks.rewards import RewardConfig, build_reward
from sparrow.train.evaluation import evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="arithmetic", choices=["arithmetic", "long_context"])
    parser.add_argument("--n", type=int, default=200, help="held-out prompts")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lengths-only", action="store_true", help="only the prompt lengths")
    args = parser.parse_args()

    lm = load_model(ModelConfig(args.model))
    tasks = TaskConfig(kind=args.task, num_heldout=args.n, num_examples=0)
    data = load_prompts(
        DataConfig(split="heldout", tasks=tasks, max_prompt_tokens=8192), lm.tokenizer
    )
    lengths = sorted(len(p.token_ids) for p in data.prompts)
    q = statistics.quantiles(lengths, n=20)
    print(
        f"{args.task}: {len(lengths)} prompts, tokens min {lengths[0]} p5 {q[0]:.0f} "
        f"median {statistics.median(lengths):.0f} mean {statistics.mean(lengths):.0f} "
        f"p95 {q[-1]:.0f} max {lengths[-1]}"
    )
    if args.lengths_only:
        return
    engine = LLMEngine(lm.model, lm.tokenizer, EngineConfig(num_pages=4096))
    reward = build_reward(RewardConfig())
    for temperature in args.temperatures:
        params = SamplingParams(temperature=temperature, max_tokens=args.max_new_tokens)
        result, _ = evaluate(engine, reward, data.prompts, params)
        print(
            f"T={temperature}: accuracy {result['eval/accuracy']:.3f} "
            f"(95% CI {result['eval/accuracy_lo95']:.3f}-{result['eval/accuracy_hi95']:.3f}, "
            f"n={int(result['eval/n'])}), mean completion {result['eval/len_mean']:.1f} tokens"
        )


if __name__ == "__main__":
    main()
