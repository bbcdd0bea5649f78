# The verbs CI and people both call. `make dev` once, then `make check`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: dev build test test-rust test-python lint fmt stubtest check bench simulate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

dev: $(BIN)/python  ## editable install (debug build) with the test extras
	$(BIN)/pip install -q maturin numpy pytest hypothesis pytest-benchmark mypy ruff
	$(BIN)/maturin develop --profile dev

build: $(BIN)/python  ## the release build, as a user gets it
	$(BIN)/pip install -q '.[test]'

test: test-rust test-python

test-rust:
	cargo test --workspace

test-python:
	$(BIN)/python -m pytest

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(BIN)/ruff check python tests benches
	$(BIN)/ruff format --check python tests benches
	$(BIN)/mypy

fmt:
	cargo fmt --all
	$(BIN)/ruff format python tests benches
	$(BIN)/ruff check --fix python tests benches

stubtest:
	$(BIN)/python -m mypy.stubtest llmsched._core --allowlist .ci/stubtest-allowlist.txt

check: lint stubtest test

bench:
	$(BIN)/python -m pytest benches --benchmark-enable

simulate:
	$(BIN)/llmsched simulate

clean:
	rm -rf target $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
