# The two commands that matter: `make demo` and `make test`. Both set up what they need.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test test-fast lint setup setup-vllm setup-system clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

## demo: a one-minute soak of the embedded simulator, live view, then the summary
demo: $(STAMP)
	$(BIN)/soakd run examples/demo.yaml

setup-vllm:
	bash scripts/setup-vllm.sh

## Debian packages the tests drive for real: Prometheus + Alertmanager, Chromium (HTML report)
setup-system:
	bash scripts/setup-prometheus.sh
	bash scripts/setup-chromium.sh

## test: install everything the tests need (venv, vLLM CPU server, tiny model,
## Prometheus, Alertmanager, Chromium), then lint, type-check and run every test
test: $(STAMP) setup-vllm setup-system
	$(BIN)/ruff check soakd tests
	$(BIN)/mypy
	$(BIN)/pytest -q

## test-fast: unit tests only, no servers
test-fast: $(STAMP)
	$(BIN)/pytest -q tests/unit

lint: $(STAMP)
	$(BIN)/ruff check soakd tests
	$(BIN)/ruff format --check soakd tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .venv-vllm .cache runs
