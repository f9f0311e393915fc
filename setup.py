"""sparrow: GRPO with sparse rollouts whose tail acceptance is held above a threshold."""

from setuptools import find_packages, setup

DASHBOARDS = ["tensorboard>=2.21", "wandb-workspaces>=0.4.13,<0.5"]

setup(
    name="sparrow",
    version="0.1.0",
    description=(
        "RLVR trainer with a Triton paged block-sparse rollout engine and tail-acceptance control"
    ),
    packages=find_packages(include=["sparrow", "sparrow.*"]),
    # The CPU decode kernel's source, compiled on first use (sparrow/kernels/decode_cpu.py).
    # The Qwen3 configs a dry run plans from when the weights are not on disk.
    package_data={"sparrow.kernels": ["decode_cpu.cpp"], "sparrow.models": ["hf_configs/*.json"]},
    python_requires=">=3.10",
    install_requires=[
        # Pinned so that a CPU box takes the local CPU wheel and a GPU box the CUDA build.
        "torch==2.13.0",
        "triton>=3.5",
        # The range CI tests: the shared-prompt log-probs pass the KV cache under the keyword the
        # decoder takes (past_key_values in 5.17, cache in 5.24); .ci/run re-runs the model,
        # rollout and log-prob tests on the lowest version. Widen only after testing.
        "transformers>=5.17.0,<=5.24.0",
        "peft>=0.17",
        "datasets>=3.0",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "wandb>=0.19",
        # gguf: transformers reads the embedded SmolLM2 GGUF through it.
        "gguf>=0.10",
        "safetensors>=0.4",
        "math-verify>=0.7",
        "tqdm>=4.60",
        "matplotlib>=3.8",
        "psutil>=5.9",
        "numpy",
        # deepspeed is installed by the Makefile with --no-build-isolation (see README): a plain
        # dependency here would build it in an isolated env that pulls a multi-GB CUDA torch.
    ],
    # The dashboards beyond metrics.jsonl and W&B: TensorBoard event files
    # (logger.tensorboard.enabled) and the W&B workspace as code (sparrow-report
    # --wandb-workspace). Optional: without them those two say which package to install.
    extras_require={
        "dashboards": DASHBOARDS,
        # mypy pinned: a newer release may find new errors, and `make lint` must stay clean.
        "dev": ["pytest>=8", "ruff>=0.5", "mypy==2.4.1", *DASHBOARDS],
    },
    entry_points={
        "console_scripts": [
            "sparrow-train=sparrow.cli.train:main",
            "sparrow-bench=sparrow.bench.cli:main",
            "sparrow-generate=sparrow.cli.generate:main",
            "sparrow-eval=sparrow.cli.eval_policy:main",
            "sparrow-report=sparrow.cli.report:main",
            "sparrow-calibrate=sparrow.cli.calibrate:main",
        ]
    },
)
