# Quipu: the entry point for people and CI. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help install demo test lint typecheck bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP) ## create .venv and install quipu with its dev extras

demo: $(STAMP) ## start the embedded stack and drive a session end to end
	$(BIN)/python -m quipu.services.demo

test: $(STAMP) lint ## run the whole suite against the embedded broker and database
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP) ## import boundaries (import-linter), ruff and mypy --strict
	$(BIN)/lint-imports
	$(BIN)/ruff check quipu contracts services deploy tests bench examples
	$(BIN)/mypy

typecheck: $(STAMP) ## mypy --strict
	$(BIN)/mypy

bench: $(STAMP) ## print figures and ratios; write bench/results/latest.json
	$(BIN)/python -m bench

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
