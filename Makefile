# The README's two commands: `make plan` and `make test`. Both create the environment first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: plan test lint unit e2e bench env clean

env: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

plan: $(STAMP)
	$(BIN)/servingtopology plan

lint: $(STAMP)
	$(BIN)/ruff check planner operator servingtopology tests benchmarks e2e
	$(BIN)/mypy --strict planner
	mkdir -p build/lint && ln -sfn $(CURDIR)/planner build/lint/planner
	PYTHONPATH=build/lint $(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/python -m pytest tests -m "not e2e"

e2e: $(STAMP)
	$(BIN)/python -m pytest e2e -m e2e

test: lint unit

bench: $(STAMP)
	$(BIN)/python benchmarks/funnel_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
