# The two commands that matter: `make demo` and `make test`. Both set up what they need.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test test-fast test-tools test-docker lint setup setup-servers setup-system setup-tools bench bench-answer-end bench-manycore bench-workers clean

PIP_LOG := .cache/setup-venv-pip.log
# what ruff checks and formats; mypy's files are pyproject.toml's (soakd, bench, grafana)
LINTED  := soakd tests bench grafana

$(STAMP): pyproject.toml
	@mkdir -p .cache
	$(PY) -m venv $(VENV)
	@echo "installing soakd and its test tools into $(VENV) (log: $(PIP_LOG))"
	@{ $(BIN)/pip install -q --upgrade pip && $(BIN)/pip install -q -e '.[test]'; } \
		>$(PIP_LOG) 2>&1 || { tail -n 30 $(PIP_LOG); echo "pip failed: see $(PIP_LOG)"; exit 1; }
	touch $(STAMP)

setup: $(STAMP)

## demo: a one-minute soak of the embedded simulator, live view, then the summary
demo: $(STAMP)
	@echo "soakd demo (examples/demo.yaml): two simulated servers side by side for one minute, a"
	@echo "4 GB edge card (edge-4gb) and a datacenter GPU (datacenter): warm-up, steady Poisson"
	@echo "load, then a spike of 24 concurrent requests, past the edge card's batch of 16. The edge"
	@echo "card is MEANT to miss its SLO (TTFT p99 2 s) in the spike: expect 'Verdict: FAIL' for"
	@echo "edge-4gb and PASS for datacenter, with the reason, at the end. Ctrl-C stops early."
	@echo
	$(BIN)/soakd run examples/demo.yaml
	@echo "soakd is installed in $(VENV): run 'source $(VENV)/bin/activate' to use the soakd commands above"

## the real servers the integration tests soak: vLLM (CPU) with a tiny local model, and
## LiteLLM's proxy as the gateway to the "cloud" path; each in its own venv
setup-servers:
	bash scripts/setup-vllm.sh
	bash scripts/setup-litellm.sh

## setup-tools: every tool tests/tools drives, from Debian (scripts/setup-tools.sh):
## Prometheus + Alertmanager (promtool, amtool), docker.io + docker-compose (the compose
## CLI; test-docker's engine too), Chromium (HTML report), systemd-analyze; then checks
## that each one, and the venv's check-jsonschema and hadolint, is found
setup-tools: $(STAMP)
	bash scripts/setup-tools.sh

## Debian packages the tests drive for real: setup-tools' above, libfaketime (the fault
## suite's wall-clock steps); and llama.cpp's llama-server, built once from source
## (~10 min on 2 cores, then reused from .cache/ or /var/cache/soakd)
setup-system: setup-tools
	bash scripts/setup-faults.sh
	bash scripts/setup-llama-server.sh

## test: install everything the tests need (the servers and system packages above),
## then lint, check the format, type-check and run every test (tests/unit, tests/tools,
## tests/integration, tests/faults); the Docker tests last (test-docker)
test: $(STAMP) setup-servers setup-system
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy
	$(BIN)/pytest -q -m "not docker"
	$(MAKE) --no-print-directory test-docker

## test-docker: the `sim` compose stack on a real Docker engine (tests/docker/): installs
## Debian's docker.io + docker-compose when missing (in make test, setup-tools already
## has), starts dockerd when none runs (and stops it after), builds stand-in images
## (cached in /var/cache/soakd/docker), the soakd image, and runs, stops, kills and
## resumes the stack (~4 min warm, ~9 cold)
test-docker: $(STAMP)
	bash scripts/test-docker.sh

## test-fast: unit tests only: no servers and no external tool (promtool, hadolint,
## chromium, a compose CLI... are tests/tools: test-tools)
test-fast: $(STAMP)
	$(BIN)/pytest -q tests/unit

## test-tools: the shipped files through their tools (promtool, amtool, check-jsonschema,
## a compose CLI, hadolint, systemd-analyze, chromium); installs none (make setup-tools
## does): a missing tool skips, and fails when CI is set
test-tools: $(STAMP)
	$(BIN)/pytest -q tests/tools

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

## bench: soakd vs GuideLLM, AIPerf and vllm bench serve (~40 min, not part of test);
## installs the peers in their own venvs under .cache/bench, writes docs/benchmarks.md
bench: $(STAMP) setup-servers
	bash bench/setup_peers.sh
	$(BIN)/python bench/suite.py all
	$(BIN)/python bench/answer_end.py --out .cache/bench/results/answer-end.json

## bench-answer-end: soakd against `vllm bench serve`'s own request function on one vLLM CPU
## server (~4 min): how long the usage chunk and [DONE] trail the answer, client minus
## server TTFT and E2E in alternating rounds, and each read loop's CPU per chunk
bench-answer-end: $(STAMP) setup-servers
	$(BIN)/python bench/answer_end.py --out .cache/bench/results/answer-end.json

## bench-manycore: soakd run vs the bare loop with the client pinned to one core (taskset),
## the stub on the other cores, 64 streams; no peers (~3 min); prints the table and writes
## .cache/bench/results/manycore-<cores>c.{json,md} (docs/benchmarks.md, "Many cores")
bench-manycore: $(STAMP)
	$(BIN)/python bench/suite.py manycore

## bench-workers: run.workers (8 by default) against the stub, next to one bare loop per
## worker: 16- and 512-token streams, Poisson 5,000 req/s, TTFT at 256 streams, 3 rounds
## interleaved (~10 min on 16 cores; WORKERS=N, ROUNDS=N to change); prints issue 28's
## table and writes .cache/bench/results/workers/results.json (docs/benchmarks.md,
## "Worker processes")
bench-workers: $(STAMP)
	$(BIN)/python bench/workers.py --out .cache/bench/results/workers --workers $(or $(WORKERS),8) --rounds $(or $(ROUNDS),3) --seconds 12

clean:
	rm -rf $(VENV) .venv-vllm .cache runs
