# The verbs CI and people both call. `make dev` once, then `make check`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: dev build wheel test test-rust test-python lint fmt stubtest check bench bench-vllm simulate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

dev: $(BIN)/python  ## editable install (debug build) with the test extras
	$(BIN)/pip install -q maturin numpy rich pytest hypothesis pytest-benchmark mypy ruff
	rm -f python/llmsched/_core.cpython-*.so  # a per-version build would shadow the abi3 one
	$(BIN)/maturin develop --profile dev

# One abi3 wheel for every CPython >= 3.10, manylinux-tagged by maturin's audit of the
# glibc symbols it links (the oldest policy the build machine's glibc allows).
wheel: $(BIN)/python  ## dist/llmsched-*-cp310-abi3-manylinux_*.whl (a release build)
	$(BIN)/pip install -q 'maturin>=1.9.4,<2'
	rm -rf dist
	$(BIN)/maturin build --release --out dist

build: $(BIN)/python  ## the release build, as a user gets it
	$(BIN)/pip install -q '.[test]'

test: test-rust test-python

test-rust:
	cargo test --workspace

test-python:
	$(BIN)/python -m pytest

# The slow hypothesis profile (2,000 state-machine runs of 80 steps) and the million-step
# soaks, which the default run (and CI) deselects; minutes, on a release build.
test-slow:
	HYPOTHESIS_PROFILE=slow $(BIN)/python -m pytest -m "" -s tests/test_fuzz_stateful.py tests/test_concurrency.py

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

bench:  ## per-step costs (llmsched only here; `make bench-vllm` compares with vLLM)
	$(BIN)/llmsched bench

bench-vllm: vllm-env  ## llmsched and vLLM 0.33.0's scheduler on the same workloads
	$(VLLM_BIN)/llmsched bench

simulate:
	$(BIN)/llmsched simulate

clean:
	rm -rf target dist $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# vLLM 0.33.0's own v1 scheduler, for the benchmarks and parity checks that run it next to
# llmsched (llmsched.vllm_reference). A separate venv: vLLM pins torch and much else.
# The pinned packages install once (again when the list changes); llmsched is rebuilt and
# reinstalled on every run, as a regular (not editable) install so that it leaves the
# extension module that `make dev` builds into python/llmsched/ alone.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin

.PHONY: vllm-env vllm-smoke test-slow

$(VLLM_VENV)/.requirements-installed: benches/vllm-requirements.txt
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q --no-deps -r benches/vllm-requirements.txt
	touch $@

vllm-env: $(VLLM_VENV)/.requirements-installed  ## venv with vLLM 0.33.0 (scheduler only) and llmsched
	$(VLLM_BIN)/pip install -q --no-deps --force-reinstall .
	$(VLLM_BIN)/python -c "import llmsched.vllm_reference as r, sys; sys.exit(not r.vllm_available())"

vllm-smoke: vllm-env  ## the same small workload through vLLM and llmsched, step by step
	$(VLLM_BIN)/python benches/vllm_smoke.py

# Parity of llmsched with vLLM 0.33.0's scheduler, step by step (tests/parity/): the same
# workloads (synthetic presets, Azure and Mooncake traces) and configs through both, with
# one deterministic model runner. `parity` writes the table to docs/parity.md and .json;
# `parity-test` asserts every step identical with pytest (the main venv skips that module).
.PHONY: parity parity-test bench-vllm-pytest

$(VLLM_VENV)/.parity-requirements-installed: tests/parity/requirements.txt $(VLLM_VENV)/.requirements-installed
	$(VLLM_BIN)/pip install -q --no-deps -r tests/parity/requirements.txt
	touch $@

parity: vllm-env  ## run the parity matrix in .venv-vllm; writes docs/parity.{md,json}
	$(VLLM_BIN)/python -m tests.parity.report

parity-test: vllm-env $(VLLM_VENV)/.parity-requirements-installed  ## assert parity with pytest in .venv-vllm
	$(VLLM_BIN)/python -m pytest tests/parity

# pytest-benchmark's view of the same cases, llmsched and vLLM rows side by side (one thread
# per numeric pool: their spinning idle threads distort a 2-core machine's figures).
bench-vllm-pytest: vllm-env $(VLLM_VENV)/.parity-requirements-installed
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VLLM_BIN)/python -m pytest benches --benchmark-enable
