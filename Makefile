# Two commands do everything on a fresh machine:
#   make demo   - run the main job (policy comparison on the bundled Mooncake trace)
#   make test   - lint, type-check and run the whole test suite (real vLLM engines included)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint typecheck unit bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,tokenizer]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/conductor compare

lint: $(VENV)/.installed
	$(PY) -m ruff check src tests bench
	$(PY) -m ruff format --check src tests bench

typecheck: $(VENV)/.installed
	$(PY) -m mypy --strict src

unit: $(VENV)/.installed
	$(PY) -m pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
