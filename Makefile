# The two commands of the README. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow install clean-venv

# `make` alone installs (what the README says it does): the venv's own rule, first in the file, made only the venv.
.DEFAULT_GOAL := install

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Reinstall only when the project metadata changes.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[dev,offline]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/fedcache demo

# The default run stays under 10 minutes on a 2-core CI machine: its tests run in TEST_WORKERS processes
# (pytest-xdist; TEST_WORKERS=0 runs them in this one), each with one torch thread (tests/conftest.py: the workers
# keep the cores busy already). Tests marked slow (real Flower deployments, signals
# to real process trees, the full demo, the larger benchmark smoke runs, a full disk on a real tmpfs, and the
# costlier cases of a parametrized test whose cheapest case stays here) run one at a time in test-slow, which
# CI runs after it: their timings and process trees are what they test.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -m "not gpu and not slow" -n $(TEST_WORKERS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m "slow and not gpu"

clean-venv:
	rm -rf $(VENV)
