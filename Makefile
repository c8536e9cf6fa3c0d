# The two commands a new machine needs (see README.md):
#   make serve   set up .venv if needed, then run the control plane
#   make test    set up .venv if needed, then run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
SERVE_ARGS ?=
# Two pytest-xdist workers, a test file (or the files sharing one engine or the
# Ray cluster) per worker, longest first: 36 min against 61 serially on 2 cores
# (tests/conftest.py). TEST_PARALLEL= runs serially.
TEST_PARALLEL ?= -n 2 --dist loadgroup --no-loadscope-reorder

.PHONY: serve test lint bench setup results

$(VENV)/.installed: pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV)
	touch $@

setup: $(VENV)/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/inferd serve $(SERVE_ARGS)

test: $(VENV)/.installed
	$(PY) -m ruff check inferd tests benchmarks models
	$(PY) -m mypy
	$(PY) -m pytest tests $(TEST_PARALLEL) --reliability-report docs/reliability.md --durations=40

lint: $(VENV)/.installed
	$(PY) -m ruff check inferd tests benchmarks models
	$(PY) -m ruff format --check inferd tests benchmarks models
	$(PY) -m mypy

# benchmarks/RESULTS.md from the result files under benchmarks/results/
results: $(VENV)/.installed
	$(PY) benchmarks/report.py
