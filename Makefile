# The two commands a new machine needs (see README.md):
#   make serve   set up .venv if needed, then run the control plane
#   make test    set up .venv if needed, then run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
SERVE_ARGS ?=
# pytest-xdist workers for `make test`: two suit a 2-core, 24 GiB machine (each
# worker may hold a few CPU vLLM replicas of about 3 GB).
TEST_WORKERS ?= 2

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
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --reliability-report docs/reliability.md --durations=40

lint: $(VENV)/.installed
	$(PY) -m ruff check inferd tests benchmarks models
	$(PY) -m ruff format --check inferd tests benchmarks models
	$(PY) -m mypy

# benchmarks/RESULTS.md from the result files under benchmarks/results/
results: $(VENV)/.installed
	$(PY) benchmarks/report.py
