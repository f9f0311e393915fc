"""`sparrow-generate`: prompts in, JSONL of sampled completions with per-token data out.

    sparrow-generate --out runs/gen.jsonl                                  # embedded arithmetic
    sparrow-generate --prompts data.jsonl --column question --n 4 --budget-tokens 512 --out o.jsonl
    sparrow-generate --task long_context --schedule conf/schedule/cpu_online.yaml --out o.jsonl

Prompts come from a jsonl/json/parquet/csv file (`--column` names the user message) or from the
embedded task generator (`--prompts tasks`, the default), rendered with the chat template. Each
output line is one sample: the prompt, the completion text and finish reason, and per generated
token its id, full-vocabulary log-prob at the temperature (`logprobs`), log-prob under the
top-k/top-p truncated distribution it was drawn from (`sampling_logprobs`), KV pages read per
sparse layer (`budget_pages`) and context length (`context_lens`); `--topk` adds the top-K ids and
log-probs. Decode is dense unless `--budget-tokens` or `--schedule` is given.
"""

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch

from sparrow.cli.errors import (
    ArgumentParser,
    UserError,
    at_least,
    model_not_found,
    one_line,
    run_main,
)
from sparrow.control.schedule import build_schedule, load_schedule_config
from sparrow.malloc import tune_cpu_allocator
from sparrow.models.loading import ModelConfig, load_model
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.tasks.data import DataConfig, DataError, load_prompts
from sparrow.tasks.generators import TaskConfig


def main(argv: list[str] | None = None) -> int:
    return run_main("sparrow-generate", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = _parse(argv)
    _check_bounds(args)
    torch.manual_seed(args.seed)
    tune_cpu_allocator()
    try:
        lm = load_model(ModelConfig(args.model, dtype=args.dtype))
    except OSError as err:
        model_not_found(err, "--model", args.model)
        raise
    except ValueError as err:  # ModelUnreadable: a directory whose weights are damaged
        raise UserError(one_line(err)) from err
    dataset = _load_dataset(args, lm.tokenizer)
    prompts = dataset.prompts[: args.limit] if args.limit else dataset.prompts
    longest = max(len(p.token_ids) for p in prompts)
    _check_positions(longest, args.max_tokens, lm.model.config)
    _check_pool(longest, args)
    engine_cfg = EngineConfig(
        page_size=args.page_size,
        num_pages=args.num_pages,
        max_batch_size=args.max_batch_size,
        score=args.score,
        topk_logprobs=args.topk or 20,
        dtype=args.dtype,
        seed=args.seed,
    )
    schedule = _schedule(args)
    try:
        engine = LLMEngine(lm.model, lm.tokenizer, engine_cfg, schedule=schedule)
    except ValueError as err:  # a model family or window the engine does not run
        raise UserError(f"--model {args.model}: {one_line(err)}") from err
    print(f"sparrow-generate: {dataset.summary()}; generating for {len(prompts)}", file=sys.stderr)
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        stop_strings=tuple(args.stop),
    )
    start = time.perf_counter()
    try:
        outputs = engine.generate([p.token_ids for p in prompts], params, n=args.n, progress=True)
    except ValueError as e:  # a prompt the KV pool cannot hold with its completion
        raise UserError(f"{one_line(e)} (--num-pages {args.num_pages}, --max-tokens)") from e
    elapsed = time.perf_counter() - start
    _write_outputs(outputs, prompts, args, elapsed, engine.last_stats.num_preemptions)
    return 0


def _load_dataset(args: argparse.Namespace, tokenizer):
    """The prompts the options name (a file's column or the embedded task generator)."""
    data = DataConfig(
        source=args.prompts,
        split=args.split,
        prompt_column=args.column,
        answer_column=args.answer_column,
        chat_template=not args.no_chat_template,
        max_prompt_tokens=args.max_prompt_tokens,
        shuffle_seed=None,
        tasks=TaskConfig(kind=args.task, num_examples=args.limit or 2000, seed=args.seed),
    )
    try:
        return _load(data, tokenizer)
    except DataError as e:
        raise UserError(one_line(e)) from e  # it names the file, row or column


def _check_pool(longest: int, args: argparse.Namespace) -> None:
    """Refuse a KV pool that cannot hold the longest prompt with its completion: what the
    scheduler requires of one request (its last sampled token is never cached)."""
    need = -(-(longest + args.max_tokens - 1) // args.page_size)
    if need > args.num_pages:
        raise UserError(
            f"--num-pages {args.num_pages} cannot hold the longest prompt ({longest} tokens) "
            f"with --max-tokens {args.max_tokens}: it needs {need} pages of {args.page_size}; "
            "raise --num-pages or lower --max-tokens / --max-prompt-tokens"
        )


def _write_outputs(outputs, prompts, args, elapsed: float, num_preemptions: int) -> None:
    """One JSON line per sample to --out, then a one-line summary on stderr."""
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("w") as f:
        for o in outputs:
            f.write(json.dumps(_row(o, prompts[o.prompt_index], args.topk)) + "\n")
    num_tokens = sum(len(o.token_ids) for o in outputs)
    reasons = dict(Counter(o.finish_reason for o in outputs))
    print(
        f"sparrow-generate: {len(outputs)} completions, {num_tokens} tokens in {elapsed:.1f} s "
        f"({num_tokens / elapsed:.1f} tok/s), finish {reasons}, "
        f"{num_preemptions} preemptions -> {out_path}",
        file=sys.stderr,
    )


def _check_bounds(args: argparse.Namespace) -> None:
    """Refuse, naming the options, values outside what they mean together (single counts are
    bounded by their argparse types)."""
    if args.budget_tokens is not None and args.schedule is not None:
        raise UserError("give --budget-tokens or --schedule, not both")
    top_k_bad = args.top_k is not None and args.top_k < 1
    if args.temperature < 0 or not 0 < args.top_p <= 1 or top_k_bad:
        raise UserError(
            f"--temperature {args.temperature}, --top-p {args.top_p}, --top-k {args.top_k}: "
            "need temperature >= 0, 0 < top-p <= 1, top-k >= 1"
        )
    if args.budget_tokens is not None:
        pool_tokens = args.num_pages * args.page_size
        if not args.page_size <= args.budget_tokens <= pool_tokens:
            raise UserError(
                f"--budget-tokens {args.budget_tokens}: must be between one page "
                f"(--page-size {args.page_size}) and the KV pool (--num-pages {args.num_pages} "
                f"x {args.page_size} = {pool_tokens} tokens); leave it out to decode densely"
            )


def _load(data: DataConfig, tokenizer):
    """The training loader, which requires an answer column; a prompts-only file is fine here
    (its rows get the prompt as a stand-in answer, written out as null)."""
    try:
        return load_prompts(data, tokenizer)
    except DataError as e:
        if data.source == "tasks" or f"answer column {data.answer_column!r}" not in str(e):
            raise
        data.answer_column = data.prompt_column
        dataset = load_prompts(data, tokenizer)
        # No answer (Prompt.answer is a str for training): written out as null.
        dataset.prompts = [replace(p, answer=None) for p in dataset.prompts]  # type: ignore[arg-type]
        return dataset


def _check_positions(longest: int, max_tokens: int, model_config) -> None:
    """Refuse a prompt that the model's positions cannot hold with its completion: no KV pool
    extends them, so the advice is never a larger --num-pages."""
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions is None or longest + max_tokens <= positions:
        return
    fix = "shorten that prompt or drop its row"
    if positions > max_tokens:
        fix += f" (--max-prompt-tokens {positions - max_tokens} skips the rows over that)"
    if longest < positions:
        fix += f", or lower --max-tokens to at most {positions - longest}"
    raise UserError(
        f"the longest prompt has {longest} tokens: with --max-tokens {max_tokens} it is over the "
        f"model's {positions} positions, which no KV pool extends; {fix}"
    )


def _schedule(args):
    if args.budget_tokens is not None:
        pages = max(1, args.budget_tokens // args.page_size)
        return lambda context_tokens: pages
    if args.schedule is not None:
        schedule = build_schedule(load_schedule_config(args.schedule))
        return None if schedule is None else schedule.budget_pages
    return None


def _row(output, prompt, topk: int) -> dict:
    row = {
        "prompt_index": output.prompt_index,
        "sample_index": output.sample_index,
        "source_index": prompt.index,
        "prompt": prompt.text,
        "answer": prompt.answer,
        "completion": output.text,
        "finish_reason": output.finish_reason,
        "token_ids": output.token_ids,
        "logprobs": output.logprobs.tolist(),
        "sampling_logprobs": output.sampling_logprobs.tolist(),
        "budget_pages": output.budget_pages.tolist(),
        "context_lens": output.context_lens.tolist(),
        "num_preemptions": output.num_preemptions,
    }
    if topk:
        row["topk_ids"] = output.topk_ids[:, :topk].tolist()
        row["topk_logprobs"] = output.topk_logprobs[:, :topk].tolist()
    return row


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-generate", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output JSONL path")
    p.add_argument("--model", default="smollm2-135m-instruct", help="embedded name, hub id, dir")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--prompts", default="tasks", help='"tasks" (embedded) or a data file')
    p.add_argument("--column", default="prompt", help="column holding the user message")
    p.add_argument("--answer-column", default="answer", help="column kept as `answer` if present")
    p.add_argument("--task", default="arithmetic", choices=["arithmetic", "long_context"])
    p.add_argument("--split", default="train", help='file split, or "train"/"heldout" for tasks')
    p.add_argument("--limit", type=at_least(0), default=0, help="first N prompts only (0: all)")
    p.add_argument("--no-chat-template", action="store_true", help="feed the text as is")
    p.add_argument("--max-prompt-tokens", type=at_least(1), default=8192)
    p.add_argument("--n", type=at_least(1), default=1, help="samples per prompt")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--max-tokens", type=at_least(1), default=256)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument(
        "--topk", type=at_least(0), default=0, help="also write the top-K ids and log-probs"
    )
    p.add_argument("--budget-tokens", type=at_least(1), default=None, help="constant sparse budget")
    p.add_argument("--schedule", default=None, help="schedule YAML (conf/schedule/*.yaml)")
    p.add_argument("--score", default="quest", choices=["quest", "centroid"])
    p.add_argument("--page-size", type=at_least(1), default=16)
    p.add_argument("--num-pages", type=at_least(1), default=2048, help="KV pool size in pages")
    p.add_argument("--max-batch-size", type=at_least(1), default=64)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
