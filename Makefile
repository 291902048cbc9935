# `make lint`, `make test` and `make demo` work on a fresh Linux machine with Python 3.10+ and only the package index.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --disable-pip-version-check -q -c .ci/constraints.txt
PYTEST_ARGS ?=

.PHONY: setup test test-all demo demo-rl demo-rlhf demo-vision bench lint clean gpu-check

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml .ci/constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch pulls a 5 GB CUDA build
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]"
	touch $@

# test workers: the CPUs this process may use, from 2 to 4 (each worker keeps a recipe runner to fork from)
WORKERS ?= $(shell $(PYTHON) -c "import os; print(max(2, min(4, len(os.sched_getaffinity(0)))))")

test: setup
	$(BIN)/python -m pytest -m "not slow" -n $(WORKERS) --dist worksteal --timeout 600 $(PYTEST_ARGS)

test-all: setup
	$(BIN)/python -m pytest -n $(WORKERS) --dist worksteal --timeout 1800 $(PYTEST_ARGS)

# formatting, lint rules and the import contracts (all configured in pyproject.toml); changes no file
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

demo: setup
	bash demo/run_demo.sh $(BIN)

demo-rl: setup
	bash demo/run_demo_rl.sh $(BIN)

demo-rlhf: setup
	bash demo/run_demo_rlhf.sh $(BIN)

demo-vision: setup
	bash demo/run_demo_vision.sh $(BIN)

# On a machine with one CUDA GPU and the packages tune needs (benchmarks/README.md, "On a GPU"): the gpu test tier,
# then tune's recipes against torchtune 0.6.1's (give its wheel to compare: TORCHTUNE_WHEEL=path/to/wheel).
GPU_CHECK_OUT ?= gpu-check
TORCHTUNE_WHEEL ?=
gpu-check:
	$(PYTHON) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(if $(TORCHTUNE_WHEEL),--torchtune-wheel $(TORCHTUNE_WHEEL))

clean:
	rm -rf $(VENV) build dist .pytest_cache
