"""The dispatch counter behind the sync guard and `sparrow-bench decode`."""

import pytest
import torch

from sparrow.bench.dispatch_counter import DispatchCounter, HostSyncError


@pytest.mark.parametrize(
    "sync",
    [
        lambda t: int(t[0]),
        lambda t: t.tolist(),
        lambda t: t.nonzero(),
        lambda t: torch.unique(t),
        lambda t: t[t > 1],
        lambda t: t.masked_select(t > 1),
    ],
    ids=["int", "tolist", "nonzero", "unique", "bool_index", "masked_select"],
)
def test_strict_guard_raises_on_each_kind_of_host_sync(sync):
    t = torch.arange(4)
    with pytest.raises(HostSyncError), DispatchCounter(strict=True):
        sync(t)
    with DispatchCounter() as counter:
        sync(t)
    assert counter.num_syncs == 1


def test_counts_kernels_not_views_or_no_op_casts():
    x = torch.randn(4, 6)
    idx = torch.tensor([0, 1])
    with DispatchCounter(strict=True) as counter:
        y = x.view(6, 4).t()[:2].unsqueeze(0).expand(3, 2, 6)  # views only
        y = x.reshape(-1)[:5]  # a view too: x is contiguous
        y = y.float().contiguous()  # nothing to do
        z = (x * 2).index_select(0, idx)  # two kernels
        z.add_(1)  # one in place
        z = z[idx]  # integer indexing: fixed shape, a kernel
    assert counter.num_syncs == 0
    assert dict(counter.launches) == {"mul": 1, "index_select": 1, "add_": 1, "index": 1}
