"""What the GPU's hot path must not do, checked op by op under fake tensors, naming the sparrow
line that did it.

`HotPathGuard` is a TorchDispatchMode over `FakeTensorMode`. Code is *in a region* while a frame
of one of the region's functions is on the stack, e.g. the decode forward (`ModelRunner._forward`,
what a CUDA graph captures) or the prefill forward (`DecoderModel.prefill`). In a region, an op
fails the rehearsal (`RehearsalFault`) when it
- makes or returns a CPU tensor, or copies one to the device: inside a captured graph a host
  tensor is a host-to-device copy per replay at best, a device mismatch at worst;
- reads a value back (`.item()`, `.tolist()`, `int(t)`): a device sync, which a graph capture
  also forbids;
- upcasts on the half-precision path: an aten op with a bf16/fp16 input and an fp32 output of
  at least `upcast_elements` elements (a whole activation, not a per-row statistic), unless the
  site is allowed (`allowed_upcasts`: the LM head's logits, which the sampler takes in fp32 by
  contract). Ops that return an fp32 statistic beside their result by design (the fused
  attention kernels' log-sum-exp) and sparrow's own ops (their dtypes are their contract) are
  not upcasts.
Outside the regions, a value read back from a tensor whose value nobody knows (fake tensors hold
none; `HostValues` answers for what the host knows) gets a placeholder at the sites that read
values back by design (`host_reads_at`: the engine's step loop reads its sampled tokens,
DistillSparse its metrics), the site's own or `PLACEHOLDERS`' for the dtype, and is counted per
site in `host_reads`; anywhere else, and for a data-dependent shape, it fails. A device mismatch
fails anywhere. Every failure is a `RehearsalFault` naming the site: the innermost frame under
sparrow/ when the op was called (`sparrow/rollout/model.py:301 (_forward)`), with the sparrow
frames above it for context.
"""

from collections import Counter
from collections.abc import Iterable, Mapping

import torch
from host_values import tensors_in
from stack_regions import StackRegions, sparrow_frames, where
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorDeviceMismatchError,
)
from torch.utils._python_dispatch import TorchDispatchMode

HALF = (torch.bfloat16, torch.float16)
SYNC_OPS = {"_local_scalar_dense", "nonzero", "unique", "_unique", "_unique2", "unique_dim",
            "unique_consecutive", "masked_select", "item"}  # fmt: skip
# Fused attention returns its fp32 log-sum-exp beside the half-precision output.
# What `.item()` returns outside the regions for a value fake tensors do not hold: a token id
# that is no special token of the tiny tokenizer, and zeros.
PLACEHOLDERS = {"int": 7, "float": 0.0, "bool": False}
STATISTIC_OPS = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention"}  # fmt: skip


class RehearsalFault(AssertionError):
    """The rehearsed code did something the GPU path must not; the message names the site."""


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype.is_floating_point else "int"


class HotPathGuard(TorchDispatchMode):
    def __init__(
        self,
        regions: StackRegions,
        *,
        allowed_upcasts: Iterable[tuple[str, str]] = (),
        upcast_elements: int = 4096,
        host_reads_at: Mapping[tuple[str, str], float | None] | None = None,
    ):
        super().__init__()
        self.regions = regions
        self.allowed_upcasts = set(allowed_upcasts)
        self.upcast_elements = upcast_elements
        # (path under sparrow/, function) -> the value its reads get (None: by dtype)
        self.host_reads_at = dict(host_reads_at or {})
        self.ops_checked = 0  # ops run inside a region
        self.host_reads = Counter()  # site -> values read back outside the regions
        self.sparrow_ops = Counter()  # name -> calls of the Triton kernels' ops (kernels/ops.py)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if func.namespace == "sparrow":
            self.sparrow_ops[name] += 1
        region = self.regions()
        if region is not None:
            self.ops_checked += 1
            if name in SYNC_OPS:
                self._fail(f"host sync ({name}) in the {region}")
            self._check_host_copy(region, name, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except DataDependentOutputException as e:
            site = sparrow_frames(1)
            key = (site[0][0], site[0][2]) if site else None
            if region is None and key in self.host_reads_at and name == "_local_scalar_dense":
                self.host_reads[where(site[0])] += 1
                value = self.host_reads_at[key]
                return PLACEHOLDERS[_kind(args[0].dtype)] if value is None else value
            self._fail(f"host sync ({name}: its result depends on tensor values)", e)
        except DynamicOutputShapeException as e:
            self._fail(f"host sync ({name}: its shape depends on tensor values)", e)
        except FakeTensorDeviceMismatchError as e:
            self._fail(f"device mismatch ({name}): {e}", e)
        if region is not None:
            outs = tensors_in((out,))
            if any(t.device.type == "cpu" for t in outs):
                self._fail(f"CPU tensor made in the {region} ({name})")
            if func.namespace == "aten" and name not in STATISTIC_OPS:
                self._check_upcast(region, name, args, kwargs, outs)
        return out

    def _check_host_copy(self, region: str, name: str, args, kwargs) -> None:
        if name == "_to_copy":
            device = kwargs.get("device")
            to_device = device is not None and torch.device(device).type != "cpu"
            if to_device and args[0].device.type == "cpu":
                self._fail(f"host-to-device copy in the {region} ({name})")
        if name.startswith("copy_") and args[1].device.type == "cpu" != args[0].device.type:
            self._fail(f"host-to-device copy in the {region} ({name})")

    def _check_upcast(self, region: str, name: str, args, kwargs, outs) -> None:
        inputs = tensors_in(args, kwargs.values())
        if not any(t.dtype in HALF for t in inputs):
            return
        big = [t for t in outs if t.dtype == torch.float32 and t.numel() >= self.upcast_elements]
        if not big:
            return
        site = sparrow_frames(1)
        if site and (site[0][0], site[0][2]) in self.allowed_upcasts:
            return
        shape = tuple(big[0].shape)
        self._fail(f"fp32 upcast on the half-precision {region} ({name} -> {shape})")

    @staticmethod
    def _fail(what: str, cause: BaseException | None = None):
        frames = sparrow_frames()
        site = where(frames[0]) if frames else "(no sparrow frame)"
        context = "".join(f"\n  called from {where(f)}" for f in frames[1:])
        raise RehearsalFault(f"{what} at {site}{context}") from cause
