#!/usr/bin/env bash
# Run on a machine that reaches PyPI: fetch the wheels of every runtime dependency a stock PyTorch
# GPU image lacks (it has torch, triton, transformers, peft, accelerate, numpy, sympy, pyyaml,
# requests, psutil, tqdm, safetensors, pytest, matplotlib) into one folder that travels with the
# tree (git-ignored; < 64 MiB) for scripts/gpu_check.sh to install offline. Pure-Python packages
# that PyPI has only as sources (antlr4-python3-runtime, deepspeed) are built into wheels here.
# Never torch, triton or nvidia-*: every download is --no-deps, from the list below.
#
#   bash scripts/gpu_wheels.sh                         # Python 3.12, manylinux x86-64 -> wheels/
#   bash scripts/gpu_wheels.sh --python-version 3.11 --dest /tmp/wheels311   # e.g. for CI here
#   bash scripts/gpu_wheels.sh --stamp                 # only (re)write wheels/COMMIT
#
# Either way it writes $DEST/COMMIT (JSON: the commit the tree is at, whether tracked files
# differ from it, when, and the fingerprint of the files that travel, scripts/gpu_bundle.py):
# the device gets no .git, so scripts/gpu_check.sh stamps its results from this file, and says
# whether the tree that ran is the one it was written for. Run it (--stamp is enough) right
# before each device call that carries the folder.
#
# Left out on purpose: datasets (pulls pyarrow + pandas, > 60 MiB; only data=hf_dataset reads
# it, not the GPU check's arithmetic tasks).
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=3.12
DEST=wheels
STAMP_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) PYV="$2"; shift 2 ;;
        --dest) DEST="$2"; shift 2 ;;
        --stamp) STAMP_ONLY=1; shift ;;
        *) echo "usage: $0 [--python-version X.Y] [--dest DIR] [--stamp]" >&2; exit 2 ;;
    esac
done
# The building Python needs torch, setuptools and wheel (DeepSpeed's setup.py imports torch, and
# nothing is built in isolation): $PYTHON, else the checkout's .venv (make setup), else python3.
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
mkdir -p "$DEST"

# The commit stamp: what gpu_check.sh names its results by.
COMMIT="$(git rev-parse HEAD)"
DIRTY=false
[ -z "$(git status --porcelain --untracked-files=no)" ] || DIRTY=true
"$PY" scripts/gpu_bundle.py stamp "$DEST/COMMIT" "$COMMIT" "$DIRTY"
echo "stamped $DEST/COMMIT: $(cat "$DEST/COMMIT")"
[ "$STAMP_ONLY" = 0 ] || exit 0

# The versions CI runs with. Binary or pure-Python wheels on PyPI:
WHEELS=(
    hydra-core==1.3.8 omegaconf==2.3.1                     # the config loader (sparrow/cli)
    math-verify==0.9.0 latex2sympy2_extended==1.11.0       # the default math reward
    gguf==0.19.0                                           # GGUF model files (SmolLM2)
    # DeepSpeed's own dependencies (the image may have some; these are small)
    hjson==3.1.0 py-cpuinfo==9.0.0 msgpack==1.2.4 ninja==1.13.2 einops==0.8.2
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    # W&B logging (logger.wandb.mode=online/offline; the benchmarks run it disabled)
    wandb==0.31.0 click==8.5.1 platformdirs==4.14.9 protobuf==7.36.2 xxhash==4.1.0
    cwevals==0.0.1b1 googleapis-common-protos==1.76.0 opentelemetry-api==1.45.2
    opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
    opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-semantic-conventions==0.66b2
    opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2
    importlib-metadata==10.2.0 zipp==4.1.2
)
# PyPI has sources only: built here into pure-Python wheels, without build isolation (that would
# pull a CUDA torch) and, for DeepSpeed, without compiling any op (they JIT-build on first use).
SOURCES=(antlr4-python3-runtime==4.9.3 deepspeed==0.19.8)

"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
    --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$DEST" "${WHEELS[@]}"
SDIST=$(mktemp -d)
trap 'rm -rf "$SDIST"' EXIT
"$PY" -m pip download -q --no-deps --no-binary=:all: -d "$SDIST" "${SOURCES[@]}"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$SDIST"/*
for whl in "$DEST"/*.whl; do
    case "$(basename "$whl")" in
        torch-*|triton-*|nvidia_*|nvidia-*) echo "refusing $whl" >&2; exit 1 ;;
    esac
done
ls -1 "$DEST"
du -sh "$DEST"
