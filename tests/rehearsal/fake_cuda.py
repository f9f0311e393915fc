"""A fake CUDA device on the CPU-only torch: what the rehearsals need beyond `FakeTensorMode`.

`FakeTensorMode` makes tensors with device "cuda" whose ops run their shape rules and allocate
nothing. A CPU-only build still lacks a few things a GPU program touches; they are artefacts of
that build, not of the code under rehearsal, and are stood in for here, in the tests only:
- Tensor methods whose Python binding takes a CUDA device guard before dispatching
  (`__getitem__`, `__setitem__`, `copy_`, `contiguous`, `expand_as`, a move to CUDA) raise
  "not linked with support for cuda devices": `FakeCudaMethods` (a TorchFunctionMode) runs
  them as the aten ops they dispatch to, which need no guard.
- `F.scaled_dot_product_attention` on CUDA picks a fused kernel at runtime (flash without a
  mask, memory-efficient with one; GQA supported by both); the CPU-only build falls back to the
  math path, which materialises the (L, S) scores. `FakeCudaMethods` calls the kernel a GPU
  would pick, so memory is that kernel's (the math path stays for what neither takes).
- `torch.Generator(device="cuda")`, `Tensor.pin_memory`, `torch.cuda.get_device_properties`,
  streams and CUDA graphs do not exist: `fake_cuda_runtime` patches torch with stand-ins for
  the duration (an H200's properties; a graph captures by running the forward once and replays
  nothing; streams are no-ops). `FakeCudaGraph` records what each capture held.
- `Module.to` swaps each parameter with its converted copy (`torch.utils.swap_tensors`), which
  refuses a tensor with weak references, and the fake tensor converter keeps one to every fake
  parameter (its memo): the check is relaxed for fake tensors, so that a model made on the CPU
  moves to "cuda" as the trainer moves it, and peft casts its adapters.
Not stood in: autograd on fake CUDA tensors (the autograd engine takes a device guard in C++
and aborts the process), so backward passes are rehearsed on fake CPU tensors.
"""

import contextlib
import weakref
from types import SimpleNamespace
from unittest import mock

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

H200 = SimpleNamespace(name="NVIDIA H200 (fake)", total_memory=139 * 2**30,
                       multi_processor_count=132, major=9, minor=0)  # fmt: skip
_GUARD_ERROR = "not linked with support for cuda devices"


def _is_cuda(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "cuda"


def _indices(x: torch.Tensor, index) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Basic indexing of `x` as views (ints, slices, None, Ellipsis) and the advanced indices
    (tensors, lists) left for aten.index, per result dim: what the binding's applySlicing does."""
    if not isinstance(index, tuple):
        index = (index,)
    index = tuple(torch.tensor(i, device=x.device) if isinstance(i, list) else i for i in index)
    consumed = sum(
        i.dim() if isinstance(i, torch.Tensor) and i.dtype == torch.bool else 1
        for i in index
        if i is not None and i is not Ellipsis
    )
    result, dim, advanced = x, 0, []
    for i in index:
        if i is Ellipsis:
            dim += x.dim() - consumed
        elif i is None:
            result = aten.unsqueeze.default(result, dim)
            dim += 1
        elif isinstance(i, bool):
            raise NotImplementedError("fake_cuda: indexing with a Python bool")
        elif isinstance(i, int) or (isinstance(i, torch.SymInt)):
            result = aten.select.int(result, dim, i)
        elif isinstance(i, slice):
            start = 0 if i.start is None else i.start
            stop = torch.iinfo(torch.int64).max if i.stop is None else i.stop
            result = aten.slice.Tensor(result, dim, start, stop, i.step or 1)
            dim += 1
        elif isinstance(i, torch.Tensor):
            advanced += [None] * (dim - len(advanced)) + [i]
            dim += i.dim() if i.dtype == torch.bool else 1
        else:
            raise NotImplementedError(f"fake_cuda: index {type(i).__name__}")
    return result, advanced


def _getitem(x, index):
    result, advanced = _indices(x, index)
    return aten.index.Tensor(result, advanced) if advanced else result


def _setitem(x, index, value):
    view, advanced = _indices(x, index)
    if not isinstance(value, torch.Tensor):
        value = torch.tensor(value, dtype=x.dtype, device=x.device)
    if advanced:
        aten.index_put_.default(view, advanced, value.to(x.dtype))
    else:
        aten.copy_.default(view, value)


def _to(x, *args, copy: bool = False, **kwargs):
    """Tensor.to as aten._to_copy where a device guard is in the way: a move to or from CUDA,
    or any conversion of a CUDA tensor; NotImplemented for what the binding does itself."""
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if device is not None and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    moves = device is not None and device.type != x.device.type
    if not moves and not _is_cuda(x):
        return NotImplemented
    if not moves and (dtype is None or dtype == x.dtype):
        return aten.clone.default(x) if copy else x
    return aten._to_copy.default(x, dtype=dtype or x.dtype, device=device or x.device,
                                 non_blocking=non_blocking)  # fmt: skip


def _contiguous(x, memory_format=torch.contiguous_format):
    if x.is_contiguous(memory_format=memory_format):
        return x
    return aten.clone.default(x, memory_format=memory_format)


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):  # fmt: skip
    """The fused kernel a GPU picks (torch's sdp_utils: flash needs no mask, fp16/bf16, head
    dim <= 256; memory-efficient takes a mask; both take GQA on CUDA)."""
    head_dim = q.shape[-1]
    if attn_mask is None and q.dtype in (torch.float16, torch.bfloat16) and head_dim <= 256:
        return aten._scaled_dot_product_flash_attention.default(
            q, k, v, dropout_p, is_causal, False, scale=scale
        )[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        attn_mask = aten.where.ScalarOther(attn_mask, zero, float("-inf"))  # additive bias
    if attn_mask is not None:
        shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        attn_mask = aten.expand.default(attn_mask, shape)
    return aten._scaled_dot_product_efficient_attention.default(
        q, k, v, attn_mask, False, dropout_p, is_causal, scale=scale
    )[0]


_READBACKS = {torch.Tensor.item: lambda v: v, torch.Tensor.__int__: int,
              torch.Tensor.__float__: float, torch.Tensor.__bool__: bool,
              torch.Tensor.__index__: int}  # fmt: skip


class FakeCudaMethods(TorchFunctionMode):
    """Runs the guarded Tensor methods on fake CUDA tensors as plain aten ops (see the module
    docstring); anything else, and every CPU call, runs as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.pin_memory:
            return args[0]  # no pinned memory without a driver; the copy it feeds is the same
        if func is F.scaled_dot_product_attention:
            if _is_cuda(args[0]):
                return _sdpa(*args, **kwargs)
            return func(*args, **kwargs)
        if func is torch.Tensor.to or func is torch.Tensor.cuda:
            x = args[0]
            out = _to(x, *args[1:], **kwargs) if func is torch.Tensor.to else _to(x, "cuda")
            return func(*args, **kwargs) if out is NotImplemented else out
        if not any(_is_cuda(a) for a in args[:1]):
            return func(*args, **kwargs)
        if func is torch.Tensor.__getitem__:
            return _getitem(*args)
        if func is torch.Tensor.__setitem__:
            return _setitem(*args)
        if func is torch.Tensor.contiguous:
            return _contiguous(*args, **kwargs)
        if func is torch.Tensor.expand_as:
            return aten.expand.default(args[0], list(args[1].shape))
        if func is torch.Tensor.copy_:
            return aten.copy_.default(*args, **kwargs)
        if func in _READBACKS:  # a read-back: the same aten op the binding dispatches
            return _READBACKS[func](aten._local_scalar_dense.default(args[0]))
        if func is torch.Tensor.tolist:
            return aten._to_copy.default(args[0], device=torch.device("cpu")).tolist()
        try:
            return func(*args, **kwargs)
        except RuntimeError as err:  # another guarded method: its aten op, if it has one
            op = getattr(aten, getattr(func, "__name__", ""), None)
            if _GUARD_ERROR not in str(err) or op is None:
                raise
            return op(*args, **kwargs)


class FakeCudaGraph:
    """torch.cuda.CUDAGraph: `torch.cuda.graph(g)` runs its block once (the capture, which
    executes the forward on fake tensors); `replay` runs nothing."""

    def __init__(self, *args, **kwargs):
        self.num_replays = 0

    def replay(self):
        self.num_replays += 1

    def pool(self):
        return ("fake-pool", id(self))


@contextlib.contextmanager
def _graph(graph, pool=None, stream=None, **kwargs):
    yield graph


class _Stream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def synchronize(self):
        pass


_REAL_GENERATOR = torch.Generator


class _Generator(_REAL_GENERATOR):
    """torch.Generator, made on the CPU whatever the device: fake random ops take it and draw
    nothing. A subclass, so that annotations and isinstance checks against torch.Generator
    still work while it stands in."""

    def __new__(cls, device="cpu"):
        return _REAL_GENERATOR.__new__(cls, "cpu")

    def __init__(self, device="cpu"):
        pass


# torch.utils.swap_tensors' view of weak references: none for fake tensors (see the docstring).
_SWAP_WEAKREFS = SimpleNamespace(
    getweakrefs=lambda t: [] if isinstance(t, FakeTensor) else weakref.getweakrefs(t)
)


@contextlib.contextmanager
def fake_cuda_runtime():
    """torch.cuda's runtime pieces as stand-ins (see the module docstring), and the guarded
    methods as aten ops (`FakeCudaMethods`), for the duration."""
    patches = [
        mock.patch.object(torch, "Generator", _Generator),
        mock.patch.object(torch.cuda, "get_device_properties", lambda device=None: H200),
        mock.patch.object(torch.cuda, "Stream", _Stream),
        mock.patch.object(torch.cuda, "current_stream", lambda device=None: _Stream()),
        mock.patch.object(torch.cuda, "stream", lambda stream: contextlib.nullcontext()),
        mock.patch.object(torch.cuda, "CUDAGraph", FakeCudaGraph),
        mock.patch.object(torch.cuda, "graph", _graph),
        mock.patch.object(torch.cuda, "synchronize", lambda device=None: None),
        mock.patch.object(torch.utils, "weakref", _SWAP_WEAKREFS),
    ]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        stack.enter_context(FakeCudaMethods())
        yield
