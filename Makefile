# The two set-up commands of the README: `make demo` and `make test`, each from a fresh clone.
# `make check` is the edit-test loop: ruff and the tests that stay in one process (tests/tiers.py).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test check lint bench clean

# torch is installed first and pinned, so that no later step can pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gradwire compare --config examples/demo.yaml --out runs/demo --overwrite

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples scripts
	$(PY) -m pytest -q -n 3 --dist load --maxschedchunk 4 --durations=25

check: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples scripts
	$(PY) -m pytest -q -n 2 --dist load -m "not multiprocess"

bench: $(STAMP)
	$(PY) benchmarks/compressors.py
	$(PY) benchmarks/simulator.py

clean:
	rm -rf $(VENV) runs build src/*.egg-info
