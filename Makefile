# Quipu: the entry point for people and CI. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXAMPLE := examples/supportdesk
PYTEST_ARGS ?=
# Two pytest-xdist workers, each with its own embedded stack; a test file stays on one worker, so
# its module fixtures (service processes, a fresh venv) start once, and the folders that start whole
# fleets (e2e, chaos, hostile) run one after another on one worker (tests/conftest.py). Work is
# handed out in collection order, not largest first: the fleets start early and unit's many short
# files fill the end. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2

.PHONY: help install demo test lint typecheck bench bench-fleet clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(EXAMPLE)/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]" -e "./$(EXAMPLE)[test]"
	touch $(STAMP)

install: $(STAMP) ## create .venv, install quipu with its dev extras and the example project

demo: $(STAMP) ## start the embedded stack, drive a session end to end, then the example project
	$(BIN)/python -m quipu.services.demo

# The suite starts many interpreters (services, `quipu` commands) and rewrites the asserts of
# every test module: without bytecode caches each of them compiles Quipu's source again (~0.5 s of
# CPU each, ~11 s for the collection). So they are kept, under .venv, even where the environment
# sets PYTHONDONTWRITEBYTECODE (which then still holds for the checkout itself: nothing is written
# next to the sources).
test: $(STAMP) lint ## run the whole suite against the embedded broker and database
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX="$(CURDIR)/$(VENV)/pycache" $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: $(STAMP) ## import boundaries (import-linter), ruff and mypy --strict
	$(BIN)/lint-imports
	$(BIN)/ruff check quipu contracts services deploy tests bench examples
	$(MAKE) --no-print-directory typecheck

# The example is a project of its own (its own mypy settings): checked from its folder, Quipu's
# modules read for their types only, as an installed Quipu's would be.
typecheck: $(STAMP) ## mypy --strict
	$(BIN)/mypy
	cd $(EXAMPLE) && MYPYPATH=../.. ../../$(BIN)/mypy --follow-imports=silent supportdesk tests

bench: $(STAMP) ## print figures and ratios; write bench/results/latest.json
	$(BIN)/python -m bench

bench-fleet: $(STAMP) ## only the services-in-processes figures (idle CPU, 200 sessions, scaling, isolation)
	$(BIN)/python -m bench.fleet_bench

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
