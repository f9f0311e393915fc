"""How a step's rows are cut into the actor's micro-batches: by row count, or by a token budget.

A micro-batch is a contiguous row range (rows of a GRPO group are consecutive). Two rules:
- by rows (`micro_batch_slices`): `micro_batch_size` rows, or whole groups packed up to it;
- by tokens (`token_budget_slices`): as many rows as fit `max_tokens` decoder tokens of the
  padded layout the policy runs (`layout_tokens`), and, with shared prompts, as many rows x the
  longest prompt: the policy indexes each group's prompt K/V out to every row of the group
  before the completions run, so the rows' prompts are held in every layer although they are
  computed once. A group that fits a fresh micro-batch is kept whole, so its prompt is computed
  once; a group that does not (long generations: 8 rows x 16K tokens; long prompts: 8 rows x 4K)
  is split row-wise, each part computing the prompt again. Activation memory then follows the
  budget, not the group size (sparrow.train.memory.plan).
Splitting never changes the loss or the gradient: the loss is normalised by the global token
count of the step, so the applied gradient is the plain sum over micro-batches.
"""

from torch import Tensor


def micro_batch_slices(
    num_rows: int, micro_batch_size: int, group_ids: Tensor | None = None
) -> list[slice]:
    """Row ranges of the micro-batches: `micro_batch_size` rows each, or, given `group_ids` (B,),
    whole groups (runs of equal consecutive ids) packed up to `micro_batch_size` rows.

    A group is never cut, so that its prompt is computed once: a micro-batch holds
    max(1, micro_batch_size // G) groups of G rows, and one group when G > micro_batch_size (its
    activations are those of P + G * C tokens, against micro_batch_size * (P + C) unshared).
    """
    if group_ids is None:
        return [slice(s, s + micro_batch_size) for s in range(0, num_rows, micro_batch_size)]
    slices: list[slice] = []
    for group in _runs(group_ids):
        if slices and group.stop - slices[-1].start <= micro_batch_size:
            slices[-1] = slice(slices[-1].start, group.stop)
        else:
            slices.append(group)
    return slices


def layout_tokens(
    lengths: Tensor, prompt_lens: Tensor | None = None, group_ids: Tensor | None = None
) -> int:
    """Decoder tokens of one micro-batch as the policy pads it: rows (b,) of `lengths` tokens run
    as (b, max length); with `prompt_lens` and `group_ids` (b,) (rows of a group consecutive,
    sharing their prompt) as a (g, max prompt) prompt pass plus a (b, max completion) one."""
    if len(lengths) == 0:
        return 0
    if prompt_lens is None or group_ids is None:
        return len(lengths) * int(lengths.max())
    num_groups = 1 + int((group_ids[1:] != group_ids[:-1]).sum())
    completion = int((lengths - prompt_lens).max())
    return num_groups * int(prompt_lens.max()) + len(lengths) * completion


def token_budget_slices(
    lengths: Tensor,
    max_tokens: int,
    prompt_lens: Tensor | None = None,
    group_ids: Tensor | None = None,
) -> list[slice]:
    """Row ranges whose `layout_tokens`, and with shared prompts their rows x longest prompt,
    stay within `max_tokens` (a single row over the budget gets a micro-batch of its own).
    lengths (B,) real tokens per row; with `prompt_lens` and `group_ids` (B,) groups share their
    prompt and stay whole where a fresh micro-batch holds them, else are split row-wise."""
    num_rows = len(lengths)
    if prompt_lens is not None and group_ids is not None:  # shared prompts
        runs = _runs(group_ids)
    else:
        runs = [slice(r, r + 1) for r in range(num_rows)]

    def cost(rows: slice) -> int:
        if prompt_lens is None or group_ids is None:  # unshared
            return layout_tokens(lengths[rows])
        expanded = (rows.stop - rows.start) * int(prompt_lens[rows].max())  # K/V held per row
        return max(layout_tokens(lengths[rows], prompt_lens[rows], group_ids[rows]), expanded)

    slices: list[slice] = []
    for group in runs:
        if slices and cost(slice(slices[-1].start, group.stop)) <= max_tokens:
            slices[-1] = slice(slices[-1].start, group.stop)  # joins the current micro-batch
        elif cost(group) <= max_tokens:
            slices.append(group)  # whole, in a fresh one: its prompt is computed once
        else:
            for row in range(group.start, group.stop):  # too big for any: split row-wise
                # rows after a group's first always follow a micro-batch (slices is not empty)
                joined = slice(slices[-1].start if slices else row, row + 1)
                if row > group.start and cost(joined) <= max_tokens:
                    slices[-1] = joined
                else:
                    slices.append(slice(row, row + 1))
    return slices


def even_out(slices: list[slice], count: int) -> list[slice]:
    """Split the micro-batches with the most rows in halves until there are `count` of them:
    under ZeRO every rank must run the same number of forwards. Raises when rows run out."""
    slices = list(slices)
    while len(slices) < count:
        widest = max(range(len(slices)), key=lambda i: slices[i].stop - slices[i].start)
        sl = slices[widest]
        if sl.stop - sl.start < 2:
            raise ValueError(
                f"{slices[-1].stop - slices[0].start} rows cannot fill the {count} micro-batches "
                "another rank needs: raise actor.max_tokens_per_micro_batch"
            )
        mid = (sl.start + sl.stop) // 2
        slices[widest : widest + 1] = [slice(sl.start, mid), slice(mid, sl.stop)]
    return slices


def split_micro_batches(
    batch: dict[str, Tensor], micro_batch_size: int, group_ids: Tensor | None = None
) -> list[dict[str, Tensor]]:
    """Split every tensor of `batch` along dim 0 into micro-batches (see `micro_batch_slices`:
    pass `group_ids` when the actor shares prompts, so that groups stay whole)."""
    num_rows = next(iter(batch.values())).shape[0]
    return take(batch, micro_batch_slices(num_rows, micro_batch_size, group_ids))


def take(batch: dict[str, Tensor], slices: list[slice]) -> list[dict[str, Tensor]]:
    """The micro-batches of `batch` at the row ranges `slices`."""
    return [{k: v[sl] for k, v in batch.items()} for sl in slices]


def _runs(group_ids: Tensor) -> list[slice]:
    """Row ranges of the runs of equal consecutive ids in `group_ids` (B,)."""
    num_rows = len(group_ids)
    starts = [0, *((group_ids[1:] != group_ids[:-1]).nonzero().squeeze(1) + 1).tolist()]
    ends = [*starts[1:], num_rows]
    return [slice(s, e) for s, e in zip(starts, ends, strict=True)]
