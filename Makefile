# flatlab: one command to set up and run the demo, one to set up and run the tests.
# Both create .venv (if missing) and install flatlab with its dependencies into it (the tests also its test extras).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The torch build this project is tested with (pyproject.toml declares ranges); override to change.
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=

# Fashion-MNIST's IDX files as Debian's package dataset-fashion-mnist installs them (found there by default)
FMNIST_DIR ?= /usr/share/datasets/fashion-mnist

.PHONY: venv venv-test data slurm demo lint test test-fast bench docs-results clean

# flatlab and what it needs to run studies (the demo needs no more)
$(BIN)/flatlab: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PINS)
	$(BIN)/python -m pip install -q -e .
	touch $(BIN)/flatlab

# and the test extras (pytest, and the libraries of the vision, NLP and CLIP workloads the suite covers)
$(VENV)/.test-extras: $(BIN)/flatlab
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(VENV)/.test-extras

venv: $(BIN)/flatlab

venv-test: $(VENV)/.test-extras

## demo: a flatness comparison on digits (6 optimizers, each tuned by its own Optuna TPE + ASHA, flatness at a matched
## training loss, 3 final seeds; ends with the `flatlab compare` table; MLflow in flatlab-runs/mlflow.db)
demo: venv
	$(BIN)/flatlab run studies/digits_flatness.py --scale demo

## data: Fashion-MNIST for its workload and tests: installs dataset-fashion-mnist with apt-get when $(FMNIST_DIR) is missing
## and this runs as root on a system with apt-get; otherwise (or if apt fails) one line says how to get it, and make goes on
data:
	@if [ -d "$(FMNIST_DIR)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "data: $(FMNIST_DIR) is missing; installing Debian's dataset-fashion-mnist (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
	    || echo "data: apt-get could not install dataset-fashion-mnist; the tests that need Fashion-MNIST will skip (or fail under FLATLAB_REQUIRE_FMNIST=1)"; \
	else \
	  echo "data: $(FMNIST_DIR) is missing (install Debian's dataset-fashion-mnist as root, or see \`flatlab workloads fashion_mnist\`); its tests will skip"; \
	fi

## slurm: SLURM for tests/integration/test_slurm.py (one node) and test_slurm_multinode.py (two nodes in network
## namespaces; iproute2's ip): Debian's slurmctld, slurmd, slurm-client, munge (22.05 on Debian 12) and iproute2,
## installed with apt-get when missing and this runs as root; otherwise (or if apt fails) one line says so, and the
## tests skip (or fail under FLATLAB_REQUIRE_SLURM=1). The tests start the daemons and make the namespaces themselves.
SLURM_PACKAGES ?= slurmctld slurmd slurm-client munge iproute2
slurm:
	@if command -v sbatch >/dev/null 2>&1 && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] \
	  && { command -v ip || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ]; } >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "slurm: installing Debian's $(SLURM_PACKAGES) (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null) \
	    || echo "slurm: apt-get could not install $(SLURM_PACKAGES); the SLURM test will skip (or fail under FLATLAB_REQUIRE_SLURM=1)"; \
	else \
	  echo "slurm: SLURM is missing (install Debian's $(SLURM_PACKAGES) as root); the SLURM test will skip"; \
	fi

## test: the whole suite (unit + integration with local Ray, an MLflow server and a Ray head on 127.0.0.1, a
## one-node SLURM on 127.0.0.1 and a two-node SLURM on the test's own namespaced addresses running
## deploy/slurm/flatlab.sbatch)
test: venv-test data slurm
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## lint: ruff's checks and formatting (configured in pyproject.toml); .ci/run runs it before the tests
lint: venv-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## test-fast: skip the slow service tests
test-fast: venv-test data
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

## bench: the platform's cost per epoch (both checkpoint settings), what a round trip and a checkpoint cost, and
## whether any optimizer's step slows down over 200 steps (CNN, transformer, an MLP whose loss saturates)
bench: venv-test
	$(BIN)/python bench/platform_overhead.py
	$(BIN)/python bench/platform_overhead.py --checkpoint-every 10 --rounds 24  # ±2–3 ms per round here: 4 rounds cannot settle 2 ms
	$(BIN)/python bench/checkpoint_cost.py
	$(BIN)/python bench/optimizer_longrun.py --threads 1 --clock cpu  # CPU time on one thread: steady under other jobs

## docs-results: run the studies behind the docs' result tables and write them (docs/results/, README, docs/):
## the demo, DeepOBS's CPU re-run and fmnist_flatness; about 2 hours on 2 cores
docs-results: venv-test data
	$(BIN)/python tools/docs_results.py

clean:
	rm -rf flatlab-runs .pytest_cache
