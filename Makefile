# `make run` runs the quickstart recipe (its table within a couple of minutes on 2 cores);
# `make test` runs the test suite; `make lint` runs ruff and mypy.
# Each creates the virtual environment .venv on first use.
PY := .venv/bin/python

.PHONY: run test lint

run: .venv/installed
	.venv/bin/asyncsync run recipes/quickstart.toml

test: .venv/installed
	$(PY) -m pytest -q

lint: .venv/installed
	$(PY) -m ruff check asyncsync tests bench
	$(PY) -m mypy

.venv/installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@
