# `make lint`, `make test` and `make demo` work on a fresh Linux machine with Python 3.10+ and only the package index.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --disable-pip-version-check -q -c .ci/constraints.txt
PYTEST_ARGS ?=

.PHONY: setup test test-all demo demo-rl bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml .ci/constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch pulls a 5 GB CUDA build
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]"
	touch $@

test: setup
	$(BIN)/python -m pytest -m "not slow" -n 2 --timeout 600 $(PYTEST_ARGS)

test-all: setup
	$(BIN)/python -m pytest -n 2 --timeout 1800 $(PYTEST_ARGS)

# formatting, lint rules and the import contracts (all configured in pyproject.toml); changes no file
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

demo: setup
	bash demo/run_demo.sh $(BIN)

demo-rl: setup
	bash demo/run_demo_rl.sh $(BIN)

clean:
	rm -rf $(VENV) build dist .pytest_cache
