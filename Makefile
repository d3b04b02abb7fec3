# `make run` runs the quickstart recipe (its table within a few minutes on 2 cores: see the
# README); `make test` runs the test suite; `make lint` runs ruff and mypy; `make docs`
# builds the documentation site into site/ (strict: a broken link or reference fails).
# Each creates the virtual environment .venv on first use.
PY := .venv/bin/python

.PHONY: run test lint docs

run: .venv/installed
	.venv/bin/asyncsync run recipes/quickstart.toml

test: .venv/installed
	$(PY) -m pytest -q -n 2 --dist loadgroup

lint: .venv/installed
	$(PY) -m ruff check asyncsync tests bench
	$(PY) -m mypy

docs: .venv/installed
	$(PY) -m mkdocs build --strict

.venv/installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,docs]"
	touch $@
