"""The fused CPU decode kernel (decode_cpu.cpp): built on first use, cached, called via ctypes.

The torch backend spends a sparse layer's decode time in ~25 small ops (scores, top-k, compaction,
row index, K/V gather, SDPA), each writing its result to memory; the C++ kernel does selection and
attention per (sequence, KV head) in one pass, reading the chosen pages in place. Built with the
system C++ compiler (`$CXX`, else `c++`) for this CPU (-march=native) into
`$SPARROW_CACHE/kernels` (default ~/.cache/sparrow/kernels), keyed by the source, the flags, the
compiler and the CPU's instruction sets, so an edited source or another machine gets its own
build. Concurrent builders each write a private file and rename it into place.

No torch headers (a plain C ABI), so a build takes seconds, not the ~30 s of a torch extension.
OpenMP: the library links libgomp.so.1, which resolves to the copy torch has loaded already, so
the kernel and torch share one thread pool and `torch.get_num_threads()` threads.

Without a compiler, or with SPARROW_CPU_KERNEL=0, `cpu_kernel()` returns None and backend "auto"
runs the torch ops instead; `cpu_kernel_error()` says why.
"""

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
from torch import Tensor

from .paged_cache import PageSummary

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_cpu.cpp")
FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    # No errno or trap semantics to keep in the vector loops. Not -ffast-math: linked into a
    # shared library, GCC adds crtfastmath, which sets flush-to-zero for the whole process.
    "-fno-math-errno",
    "-fno-trapping-math",
    "-std=c++17",
    "-shared",
    "-fPIC",
)
DISABLE_ENV = "SPARROW_CPU_KERNEL"  # "0": never build or use the kernel

_lock = threading.Lock()
_state: dict[str, object] = {}  # "lib" -> CDLL | None once tried, "error" -> why not


def cpu_kernel() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on the first call; None when it cannot be used."""
    with _lock:
        if "lib" not in _state:
            _state["lib"], _state["error"] = _load()
            if _state["lib"] is None:
                reason = _state["error"]
                log.warning("sparrow: no CPU decode kernel (%s); torch ops instead", reason)
        return _state["lib"]  # type: ignore[return-value]


def cpu_kernel_error() -> str | None:
    """Why `cpu_kernel()` returned None (None if it loaded or was never tried)."""
    return _state.get("error")  # type: ignore[return-value]


def sparse_decode_cpu(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    summary: PageSummary | None,
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor | None,
    *,
    score: str,
    num_sink: int,
    num_recent: int,
    scale: float,
) -> Tensor:
    """Selection + decode attention in one call; arguments as `kernels.sparse_decode`, which
    checks them (callers that built the inputs themselves, like the engine, call this directly).
    `budgets` None: every page. Returns (B, H_q, D) fp32."""
    lib = cpu_kernel()
    if lib is None:
        raise RuntimeError(f"the cpp decode backend is unavailable: {cpu_kernel_error()}")
    batch, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    q = q.contiguous()
    page_table = page_table.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    tables: tuple[Tensor | None, Tensor | None] = (None, None)
    if budgets is not None:
        budgets = budgets.to(torch.int32).contiguous()
        assert summary is not None, "budgets come with their page summaries"
        tables = (summary.k_mean, None) if score == "centroid" else (summary.k_max, summary.k_min)
        for t in tables:
            if t is not None and not t.is_contiguous():
                raise ValueError("sparse_decode: page summary tables must be contiguous")
    out = torch.empty_like(q)
    lib.sparrow_sparse_decode(
        *(_ptr(t) for t in (q, k_cache, v_cache, page_table)),
        page_table.shape[1],
        *(_ptr(t) for t in (seq_lens, budgets, *tables)),
        batch,
        num_q_heads,
        num_kv_heads,
        head_dim,
        page_size,
        num_sink,
        num_recent,
        scale,
        _ptr(out),
        torch.get_num_threads(),
    )
    return out


def multi_query_decode_cpu(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    query_starts: Tensor,
    seq_lens: Tensor,
    *,
    scale: float,
) -> Tensor:
    """Dense attention of several query rows per sequence over its pages, read in place (the
    verify pass of speculative decoding). q (N, H_q, D) fp32: rows query_starts[s] ..
    query_starts[s + 1] - 1 are sequence s's; page_table (S, P); query_starts (S + 1,); seq_lens
    (N,) tokens each row attends to, its own included (its K/V written already). -> (N, H_q, D)."""
    lib = cpu_kernel()
    if lib is None:
        raise RuntimeError(f"the cpp decode backend is unavailable: {cpu_kernel_error()}")
    _, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    q = q.contiguous()
    page_table = page_table.to(torch.int32).contiguous()
    query_starts = query_starts.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    lib.sparrow_multi_query_decode(
        *(_ptr(t) for t in (q, k_cache, v_cache, page_table)),
        page_table.shape[1],
        _ptr(query_starts),
        _ptr(seq_lens),
        page_table.shape[0],
        num_q_heads,
        num_kv_heads,
        head_dim,
        page_size,
        scale,
        _ptr(out),
        torch.get_num_threads(),
    )
    return out


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _load() -> tuple[ctypes.CDLL | None, str | None]:
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None, f"{DISABLE_ENV}=0"
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler!r} not found; set CXX)"
    try:
        path = _build(compiler)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"build failed: {e}"
    fn = lib.sparrow_sparse_decode
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, p, p, p, i64, p, p, p, p, i64, i64, i64, i64, i64, i64, i64]
    fn.argtypes += [ctypes.c_float, p, ctypes.c_int]
    fn.restype = None
    multi = lib.sparrow_multi_query_decode
    multi.argtypes = [p, p, p, p, i64, p, p, i64, i64, i64, i64, i64, ctypes.c_float, p]
    multi.argtypes += [ctypes.c_int]
    multi.restype = None
    return lib, None


def _build(compiler: str) -> Path:
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS).encode(), version.encode(), _cpu_isa()):
        key.update(part)
    # sparrow.models.loading.cache_root's rule; kernels/ imports nothing from the rest of sparrow.
    root = os.environ.get("SPARROW_CACHE") or Path.home() / ".cache" / "sparrow"
    target = Path(root) / "kernels" / f"decode_cpu-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("sparrow: building the CPU decode kernel into %s", target)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [compiler, *FLAGS, str(SOURCE), "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise subprocess.SubprocessError(f"{' '.join(cmd)}: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _cpu_isa() -> bytes:
    """The instruction sets -march=native builds for: one cached library per kind of CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.encode()
    except OSError:
        pass
    return platform.processor().encode()
