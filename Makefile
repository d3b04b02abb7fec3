# `make run` runs the quickstart recipe; `make test` runs the test suite.
# Both create the virtual environment .venv on first use.
PY := .venv/bin/python

.PHONY: run test lint

run: .venv/installed
	.venv/bin/asyncsync run recipes/quickstart.toml

test: .venv/installed
	$(PY) -m pytest -q

lint: .venv/installed
	$(PY) -m ruff check asyncsync tests
	$(PY) -m mypy

.venv/installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@
