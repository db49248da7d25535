# dualpath-emu developer commands. `make help` lists them.

.DEFAULT_GOAL := help
SHELL := bash
.SHELLFLAGS := -euo pipefail -c

VENV := .venv
PYTHON := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.requirements-installed
BUILD_STAMP := $(VENV)/.build-stamp
FUZZ_SECONDS ?= 60
FAULT_SCHEDULES ?= 1000
ARGS ?=
# pytest-xdist workers for the pytest runs of `make test` and `make test-processes` (auto: one per CPU;
# 0: no workers, in this process), and further pytest arguments (e.g. PYTEST_ARGS="-k live --durations=20").
PYTEST_WORKERS ?= auto
PYTEST_ARGS ?=
PYTEST := $(VENV)/bin/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)
comma := ,

# Everything the extension is built from; .py files need no rebuild (maturin develop installs the
# package editable: python/ is on sys.path through a .pth file).
BUILD_INPUTS := Cargo.toml $(wildcard Cargo.lock) pyproject.toml core/Cargo.toml \
	$(shell find core -name '*.rs' -not -path '*/target/*')

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help
help: ## Show this list of targets
	@grep -hE '^[a-zA-Z0-9_.-]+:.*?## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*?## "}; {printf "  %-15s %s\n", $$1, $$2}'

.venv: $(VENV_STAMP) ## Create .venv with the pinned dev tools (redone when requirements-dev.txt changes)

$(VENV_STAMP): requirements-dev.txt
	@# Debian's libibverbs1: Mooncake's Transfer Engine (the host backend's optional transfer engine) links it.
	@if command -v dpkg-query >/dev/null && ! dpkg-query -W -f='$${Status}' libibverbs1 2>/dev/null | grep -q "ok installed"; then \
		if [ "$$(id -u)" = 0 ]; then (apt-get update -qq && apt-get install -y -qq libibverbs1 >/dev/null) || \
			echo "make: could not install libibverbs1: the host backend's Mooncake transfer engine will be unavailable"; \
		else echo "make: libibverbs1 is missing (sudo apt-get install libibverbs1) for the Mooncake transfer engine"; fi; \
	fi
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -r requirements-dev.txt
	touch $@

.PHONY: build
build: $(BUILD_STAMP) ## Build the Rust extension (release) and install the package and `dualpath-emu` into .venv

$(BUILD_STAMP): $(VENV_STAMP) $(BUILD_INPUTS)
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release
	touch $@

.PHONY: run
run: build ## Run the default cluster scenario (`dualpath-emu run $(ARGS)`, e.g. ARGS="--agents 64 --out out")
	$(VENV)/bin/dualpath-emu run $(ARGS)

.PHONY: test
test: build ## Rust tests (no libpython), stub check, pytest on PYTEST_WORKERS workers less the tests that start processes, mypy --strict, formatting
	$(MAKE) --no-print-directory format-check
	cargo test --workspace
	$(MAKE) --no-print-directory stubtest
	$(PYTEST) -m "not processes"
	$(MAKE) --no-print-directory typecheck

.PHONY: test-processes
test-processes: build ## The tests that start processes (live runs, the launcher, the host backend, pools); CI runs them after `make test`
	$(PYTEST) -m processes

.PHONY: test-orders
test-orders: build ## The cluster tests again with shuffled same-instant delivery and delayed messages (seeds 1-3; CI runs it)
	$(PYTEST) -m "not processes" tests/cluster tests/test_api.py --order-seed 1
	$(PYTEST) -m "not processes" tests/cluster tests/test_api.py --order-seed 2
	$(PYTEST) -m "not processes" tests/cluster tests/test_api.py --order-seed 3 --message-delay-ns 2000000

.PHONY: test-all
test-all: test test-processes ## Every test: `make test`, then `make test-processes`

.PHONY: typecheck
typecheck: build ## mypy --strict over the package and the tests (pyproject.toml's [tool.mypy])
	$(PYTHON) -m mypy

.PHONY: stubtest
stubtest: build ## Check python/dualpath_emu/_core.pyi against the built extension
	$(PYTHON) -m mypy.stubtest dualpath_emu._core --allowlist tests/stubtest-allowlist.txt

.PHONY: bench
bench: build ## Benchmarks; each result line reads `BENCH <name> <value> <unit>`
	cargo run --release -p dualpath-emu-core --example bench_core
	$(PYTHON) -m dualpath_emu.bench
	$(PYTHON) -m dualpath_emu.bench_runtime
	$(PYTHON) -m dualpath_emu.bench_cluster
	$(PYTHON) -m dualpath_emu.bench_cluster --agents 1024 --rounds 0 --systems dualpath --repeat 1 --label _1024 --clusters 2P4D,16P32D
	$(PYTHON) -m dualpath_emu.bench_live --capacity
	$(PYTHON) -m dualpath_emu.host.isolation

.PHONY: bench-scale
bench-scale: build ## The paper's largest run in one process: DS 660B 48P96D, 49,152 agents, whole trajectories (wall, CPU, peak RSS, JCT; stopped after 30 min of CPU)
	$(PYTHON) -m dualpath_emu.bench_cluster --clusters 48P96D --agents 49152 --rounds 0 --systems dualpath --repeat 1 --label _scale --cpu-budget-s 1800

# The full experiments of EVALUATION.md, most telling first; NAME[:OPTIONS] (options joined by commas).
EXPERIMENTS_FULL ?= table1 isolation fig7:--model,ds660b fig10 fig12 fig13 fig9 fig8 fig7:--model,ds27b fig7:--model,qwen32b

.PHONY: evaluation
evaluation: build ## Every full experiment (46 min on 2 cores; resumable: runs kept in out/cache), then EVALUATION.md's tables
	mkdir -p docs/evaluation
	for spec in $(EXPERIMENTS_FULL); do \
		name=$${spec%%:*}; opts=$$( [[ $$spec == *:* ]] && echo "$${spec#*:}" | tr , ' ' || true ); \
		stem=$$name$$( [[ -n $$opts ]] && echo "_$${opts##* }" || true ); \
		$(VENV)/bin/dualpath-emu reproduce $$name $$opts --cache out/cache --out out/evaluation/$$stem; \
		cp out/evaluation/$$stem/$$name.json docs/evaluation/$$stem.json; \
		if [[ -f out/evaluation/$$stem/$$name.png ]]; then cp out/evaluation/$$stem/$$name.png docs/evaluation/$$stem.png; fi; \
	done
	$(VENV)/bin/dualpath-emu reproduce markdown $(foreach spec,$(EXPERIMENTS_FULL),docs/evaluation/$(firstword $(subst :, ,$(spec)))$(if $(findstring :,$(spec)),_$(lastword $(subst $(comma), ,$(spec))),).json) \
		--image-dir docs/evaluation --into EVALUATION.md

.PHONY: fuzz
fuzz: build ## Run the fuzz targets (input loaders, core), FUZZ_SECONDS in all (default 60), then FAULT_SCHEDULES random fault schedules (default 1000)
	bash fuzz/run.sh $(FUZZ_SECONDS)
	FAULT_SCHEDULES=$(FAULT_SCHEDULES) $(PYTHON) -m pytest tests/cluster/test_faults.py -q -k random_fault_schedules

.PHONY: fuzz-smoke
fuzz-smoke: build ## Short, repeatable fuzz run (fixed seed and execution counts); CI runs it
	FUZZ_SEED=1 FUZZ_RUNS=30000 FUZZ_INPUTS=2000 bash fuzz/run.sh 40

.PHONY: docs
docs: build ## Regenerate docs/scenario-reference.md from the scenario reader (a test keeps it current)
	$(PYTHON) -m dualpath_emu.cluster.scenario_reference docs/scenario-reference.md

.PHONY: lint
lint: build ## rustfmt check, clippy (with and without the python feature) -D warnings, stubtest, mypy
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p dualpath-emu-core --all-targets --features python -- -D warnings
	$(MAKE) --no-print-directory stubtest
	$(MAKE) --no-print-directory typecheck

.PHONY: format-check
format-check: $(VENV_STAMP) ## Check the formatting (ruff format --check, pyproject.toml's [tool.ruff]; cargo fmt --check); part of make test
	$(VENV)/bin/ruff format --check python tests
	cargo fmt --all --check

.PHONY: format
format: $(VENV_STAMP) ## Format the Rust code (cargo fmt) and the Python code (ruff format python tests: the whole tree)
	cargo fmt --all
	$(VENV)/bin/ruff format python tests

.PHONY: clean
clean: ## Remove .venv, build outputs and caches
	rm -rf $(VENV) target build out .pytest_cache .hypothesis .mypy_cache
	rm -f python/dualpath_emu/*.so python/dualpath_emu/*.pyd
	find python tests -name __pycache__ -type d -prune -exec rm -rf {} +
