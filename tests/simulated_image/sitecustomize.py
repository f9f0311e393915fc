"""A stock PyTorch GPU image, simulated: with SPARROW_IMAGE_DEPS set (a folder), the packages such
an image lacks import only from that folder (where scripts/gpu_check.sh installs the wheel
folder), never from this interpreter's site-packages. Put this directory first on PYTHONPATH;
child processes (reward sandbox, workers) inherit it."""

import os
import sys
from importlib.machinery import PathFinder
from importlib.metadata import DistributionFinder

# Top-level import names of what the image lacks, with their dependencies.
MISSING = {
    "hydra", "omegaconf", "antlr4", "deepspeed", "hjson", "cpuinfo", "msgpack", "ninja",
    "einops", "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "wandb",
    "datasets", "pyarrow", "math_verify", "latex2sympy2_extended", "gguf",
}  # fmt: skip
# Their distribution names (importlib.metadata), normalised.
MISSING_DISTS = {
    "hydra_core", "omegaconf", "antlr4_python3_runtime", "deepspeed", "hjson", "py_cpuinfo",
    "msgpack", "ninja", "einops", "pydantic", "pydantic_core", "annotated_types",
    "typing_inspection", "wandb", "datasets", "pyarrow", "math_verify", "latex2sympy2_extended",
    "gguf",
}  # fmt: skip


class ImageFinder:
    """Stands in for the path finder: the MISSING top-level packages are looked up in the deps
    folder alone (absent there: not installed, as on the image), everything else as usual."""

    def __init__(self, deps: str):
        self.deps = deps

    def find_spec(self, name, path=None, target=None):
        if path is None and name in MISSING:
            return PathFinder.find_spec(name, [self.deps])
        return PathFinder.find_spec(name, path, target)

    def find_distributions(self, context=None):
        context = context or DistributionFinder.Context()
        name = (context.name or "").lower().replace("-", "_").replace(".", "_")
        if name in MISSING_DISTS:
            context = DistributionFinder.Context(name=context.name, path=[self.deps])
        return PathFinder.find_distributions(context)

    def invalidate_caches(self):
        PathFinder.invalidate_caches()


if os.environ.get("SPARROW_IMAGE_DEPS"):
    finder = ImageFinder(os.environ["SPARROW_IMAGE_DEPS"])
    sys.meta_path[:] = [finder if f is PathFinder else f for f in sys.meta_path]
