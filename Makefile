# hpc-train — the two commands: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PY_BOOT ?= python3.11
VENV    := .venv
PY      := $(VENV)/bin/python
STATE   := .local
# The local Slurm cluster keeps all its state here; SLURM_CONF points into it.
export HPC_TRAIN_CLUSTER_DIR ?= $(CURDIR)/$(STATE)/cluster
export SLURM_CONF := $(HPC_TRAIN_CLUSTER_DIR)/etc/slurm.conf
# Python caches the bytecode of the project's own modules, and pytest its rewritten test modules,
# in __pycache__ (ignored by git) even where the environment sets PYTHONDONTWRITEBYTECODE (this
# machine's does): every launcher, rank and CLI call of a job or a test then reads the cache
# instead of compiling the sources again. Measured here: the fast tier collects in 4.0 s, not 7.3.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: help install install-system install-python cluster-up cluster-down local-image demo-data demo test test-fast lint bench bench-preempt bench-gpu bench-gpu-restart bench-data bench-ckpt bench-verify bench-hang bench-grow bench-soak bench-import bench-levers bench-tracking bench-scale bench-decision bench-step-probe device-kit clean

help:
	@echo "make demo          install, start the local Slurm cluster, train tiny RoBERTa on 2 nodes"
	@echo "make test          install and run the whole suite (real Slurm included)"
	@echo "make cluster-up    start the local Slurm cluster (prints the SLURM_CONF to export)"
	@echo "make cluster-down  stop it (only the daemons it started)"
	@echo "make local-image   build the local cluster's container image (submit --container .local/images/hpc-train)"
	@echo "make test-fast     unit and pure tests only: no Slurm, no fairseq training, no fake AWS (< 1 min)"
	@echo "make lint          ruff, mypy, the import layers (import-linter), the size caps (tools/caps.py), shellcheck"
	@echo "make bench         every benchmark: bench-preempt, bench-data, bench-gpu, bench-gpu-restart, bench-ckpt, bench-verify, bench-hang, bench-grow, bench-soak, bench-import, bench-levers, bench-tracking, bench-scale, bench-decision, bench-step-probe (JSON in benchmarks/results/; SMOKE=1: each in its smoke mode)"
	@echo "make device-kit    what a lent GPU machine lacks (wheels, data, the project) in .local/device-kit: docs/gpu.md"

install: install-system install-python

# Debian packages: Slurm 22.05 daemons and clients, munge, shellcheck (idempotent).
install-system:
	@bash slurm/local/install-packages.sh

# Order matters: torch first (the CPU wheel on disk, never a CUDA build), then fairseq-fixed built
# against it without build isolation, then the project with its extras. The stamp makes reruns free.
# This machine's pip config names index folders that may not exist; pip warns once per package.
QUIET_PIP := 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }

install-python: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PY_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip $(QUIET_PIP)
	$(PY) -m pip install -q torch==2.13.0 $(QUIET_PIP)
	$(PY) -m pip install -q cython numpy setuptools wheel $(QUIET_PIP)
	MAX_JOBS=2 $(PY) -m pip install -q --no-build-isolation fairseq-fixed==0.12.3.1 $(QUIET_PIP)
	$(PY) -m pip install -q -e '.[aws,data,dev,tracking]' $(QUIET_PIP)
	$(PY) -c "import hpc_train, torch, fairseq, submitit; print('torch', torch.__version__, '| fairseq', fairseq.__version__, '| submitit', submitit.__version__)"
	@touch $@

cluster-up: install-system
	@bash slurm/local/cluster.sh up

# The default cluster, then any test worker's (tests/conftest.py: worker_cluster_env).
cluster-down:
	@bash slurm/local/cluster.sh down
	@for d in $(HPC_TRAIN_CLUSTER_DIR)-gw*; do \
	  if [ -d "$$d" ]; then HPC_TRAIN_CLUSTER_DIR=$$d bash slurm/local/cluster.sh down; fi; done

# The local cluster's container image (an OCI image directory for submit --container; cached:
# rebuilt only when the project's files or the venv change). cluster-up writes Slurm's oci.conf.
local-image: install
	@bash slurm/local/build-image.sh

demo-data: install-python
	$(PY) -m hpc_train.data demo --out $(STATE)/data/demo-bin

# The main job: tiny RoBERTa across 2 emulated nodes, as one 2-rank job, followed to the end.
DEMO_RUN ?= $(STATE)/runs/demo-$(shell date +%Y%m%d-%H%M%S)
demo: install cluster-up demo-data
	$(PY) -m hpc_train.submit --preset tiny --nodes 2 --gpus-per-node 0 \
	  --data $(STATE)/data/demo-bin --save-dir $(DEMO_RUN) --time 20 --follow

# Lint first (seconds): a red main is a formatting nit away from a real bug. Then the suite on
# TEST_WORKERS pytest-xdist workers (3: the real-Slurm runs are paced, so they mostly wait on
# Slurm and leave the CPU to a third worker: 25.6-31.2 min against 2 workers' 32.5; testing.md),
# each with a local cluster of its own (gw0 the one cluster-up starts; gwN its own beside it:
# tests/conftest.py, worker_cluster_env), a test to the next free worker, real-Slurm tests first
# (a file whose tests share a module fixture stays on one worker: spread_over_workers); the 20
# slowest tests are printed at the end.
TEST_WORKERS ?= 3
test: install cluster-up lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=20

# The fast tier: what a change to pure code or launcher decisions needs. No cluster, no training.
test-fast: install-python
	$(PY) -m pytest -q -n 2 -m "not slurm and not fairseq and not slow and not aws"

lint: install-python
	$(VENV)/bin/ruff check hpc_core hpc_train nccl_checks benchmarks tests tools
	$(VENV)/bin/ruff format --check hpc_core hpc_train nccl_checks benchmarks tests tools
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) tools/caps.py hpc_core hpc_train nccl_checks benchmarks
	shellcheck $$(git ls-files '*.sh' 'bootstrap/*' 'slurm/*' | grep -E '\.sh$$') .ci/run

# Every benchmark (figures, never timed tests): results as JSON under benchmarks/results/.
# SMOKE=1: each in its smoke mode (--smoke: the same code path, every size and duration shrunk;
# the suite runs it, tests/benchmarks/test_smoke.py): JSON under SMOKE_OUT, never results/.
SMOKE ?=
SMOKE_OUT ?= $(STATE)/bench-smoke
RESULTS = $(if $(SMOKE),$(SMOKE_OUT),benchmarks/results)
BENCH_FLAGS = $(if $(SMOKE),--smoke)
bench: bench-preempt bench-data bench-gpu bench-gpu-restart bench-ckpt bench-verify bench-hang bench-grow bench-soak bench-import bench-levers bench-tracking bench-scale bench-decision bench-step-probe

# Preemption benchmark (issue 3), not a test: ~3 min on a quiet local cluster; figures as ratios.
bench-preempt: install cluster-up demo-data
	$(PY) -m benchmarks.preemption $(BENCH_FLAGS) --data $(STATE)/data/demo-bin \
	  --out $(RESULTS)/preemption.json

# Data benchmark (issue 13), not a test: ~3 min on 2 cores; GPT-2 BPE lines/s of this pipeline vs
# fairseq's multiprocessing_bpe_encoder.py with the same workers, as ratios; outputs must be equal.
bench-data: install-python
	$(PY) -m benchmarks.data $(BENCH_FLAGS) --out $(RESULTS)/data.json

# GPU benchmark (issue 12), not a test: words/s, MFU, memory, checkpoint save, toolkit vs bare
# fairseq on one GPU (~13 min on an H100); says so and exits 0 where no GPU is visible.
bench-gpu: install-python demo-data
	$(PY) -m benchmarks.gpu $(BENCH_FLAGS) --data $(STATE)/data/demo-bin --out $(RESULTS)/gpu.json

# Speed levers on the CPU (issue 36), not a test: ~4 min on 2 cores; host syncs and ops per
# update at roberta-base's dimensions, the GPU's defaults and each lever on top, then all.
bench-levers: install-python demo-data
	$(PY) -m benchmarks.levers_cpu $(BENCH_FLAGS) --data $(STATE)/data/demo-bin \
	  --out $(RESULTS)/levers_cpu.json

# Tracking benchmark (issue 45), not a test: ~30 s; one logging call of rank 0's tracking
# (TensorBoard, W&B offline, both) against a roberta-large update on a GPU (results/gpu.json).
bench-tracking: install-python
	$(PY) -m benchmarks.tracking $(BENCH_FLAGS) --out $(RESULTS)/tracking.json

# The device kit (issue 36): CPython 3.12 wheels the GPU machine lacks (hash-pinned), the demo
# corpus binarized and the project, in a git-ignored folder (<= 60 MiB), checked with no index.
# On the GPU machine (the device tool, carry .local/device-kit):
#   python3 -m benchmarks.gpu_session --kit .local/device-kit --out $$OUT/gpu.json
DEVICE_KIT ?= $(STATE)/device-kit
device-kit: install-python demo-data
	$(PY) -m benchmarks.device_kit build --out $(DEVICE_KIT) --data $(STATE)/data/demo-bin

# In-job restart on one GPU (issue 19), not a test: roberta-base, cold start -> first update, a
# rank SIGKILLed -> torchrun's exit, torchrun restarted -> loaded checkpoint -> first resumed
# update, twice (a few minutes on one GPU); says so and exits 0 where no GPU is visible.
bench-gpu-restart: install-python demo-data
	$(PY) -m benchmarks.gpu_restart $(BENCH_FLAGS) --startup-parts --data $(STATE)/data/demo-bin \
	  --out $(RESULTS)/gpu-restart.json

# Checkpoint-cost benchmark (issue 11), not a test: ~3.5 min on 2 cores; RoBERTa-base dims on the
# CPU, training time per 100 updates with no saves, sync saves and async saves (ratio).
bench-ckpt: install-python demo-data
	$(PY) -m benchmarks.checkpoint_cost $(BENCH_FLAGS) --data $(STATE)/data/demo-bin \
	  --out $(RESULTS)/checkpoint_cost.json

# Verification benchmark (issue 41), not a test: ~1.5 min on 2 cores; a roberta-large checkpoint as
# a GPU run saves it (~4.5 GB under $(STATE)/bench/verify, removed after): torch.load against the
# verification (every record's CRC32 and the digest) beside it and alone, warm and cold.
bench-verify: install-python
	$(PY) -m benchmarks.verify_cost $(BENCH_FLAGS) --work-dir $(STATE)/bench/verify \
	  --out $(RESULTS)/verify_cost.json

# Hang benchmark (issue 10), not a test: ~5.5 min on 2 cores; a SIGSTOPped rank: detection and
# requeue as multiples of the watchdog's allowance T, time to the first resumed update; hangs
# declared in a fault-free run with a save every update (HANG_MINUTES of it; the issue's: 20).
# Unset: benchmarks.hang's own (3 min; its smoke mode's 0.2).
HANG_MINUTES ?=
bench-hang: install cluster-up demo-data
	$(PY) -m benchmarks.hang $(BENCH_FLAGS) --data $(STATE)/data/demo-bin \
	  $(if $(HANG_MINUTES),--fault-free-minutes $(HANG_MINUTES)) --out $(RESULTS)/hang.json

# Grow-back benchmark (issue 20), not a test: ~6 min; a --nodes 1-3 run beside a blocker that
# gives its 3 nodes back, with and without --grow-after: node-seconds used / open, updates/s.
bench-grow: install cluster-up demo-data
	$(PY) -m benchmarks.grow $(BENCH_FLAGS) --data $(STATE)/data/demo-bin --out $(RESULTS)/grow.json

# Soak benchmark (issue 19), not a test: ~45 min; one failure schedule (a preemption, a rank
# killed, a hang, a lost node, a slow node, nodes taken and given back) over 20 min of wall three
# ways: bare sbatch+torchrun+fairseq-train, the toolkit with requeues only, the toolkit in-job with
# a spare; goodput, failure -> resumed update. SOAK_BUDGET_S=300 SOAK_SCALE=0.25: a quick look.
# The local cluster is restarted for it with a requeue hold of SOAK_CRED_EXPIRE s and stopped
# after: 10, a cluster made from pcluster_configs/ on ParallelCluster 3.16 (requeue_delay=10);
# 70, ParallelCluster's default (cred_expire=70), with SOAK_OUT=benchmarks/results/soak-hold70.json;
# and with Slurm's scheduling intervals, which ParallelCluster keeps (the tests' cluster: 2 s).
# Unset: benchmarks.soak's own (1200 s and 1; its smoke mode's 25 s and 0.02).
SOAK_BUDGET_S ?=
SOAK_SCALE ?=
SOAK_CRED_EXPIRE ?= 10
SOAK_OUT ?= $(RESULTS)/soak.json
bench-soak: install install-system demo-data
	bash slurm/local/cluster.sh down
	HPC_TRAIN_CLUSTER_CRED_EXPIRE=$(SOAK_CRED_EXPIRE) HPC_TRAIN_CLUSTER_SCHEDULER_PARAMETERS= \
	  bash slurm/local/cluster.sh up
	rc=0; $(PY) -m benchmarks.soak $(BENCH_FLAGS) --data $(STATE)/data/demo-bin \
	  $(if $(SOAK_BUDGET_S),--budget-s $(SOAK_BUDGET_S)) $(if $(SOAK_SCALE),--scale $(SOAK_SCALE)) \
	  --out $(SOAK_OUT) || rc=$$?; \
	bash slurm/local/cluster.sh down; exit $$rc

clean: cluster-down
	rm -rf $(STATE)

# Scale benchmark (issue 46), not a test: 16 real and up to 64 hollow nodes (submit --hollow, a
# stand-in for the model) on a local cluster of its own (cluster.sh, ports HPC_TRAIN_CLUSTER_PORT
# + 500), each event's toolkit share, Slurm calls and file operations beside 2 nodes'. About an
# hour on 2 cores; run it alone (flock /tmp/hpc-train-heavy.lock make bench-scale).
bench-scale: install install-system demo-data
	@command -v strace >/dev/null || { if [[ $$(id -u) == 0 ]]; then apt-get install -y -qq strace; \
	  else sudo apt-get install -y -qq strace; fi; }
	$(PY) -m benchmarks.scale $(BENCH_FLAGS) --data $(STATE)/data/demo-bin \
	  --out $(RESULTS)/scale.json

# What follows a start's end (issue 43), not a test: the pure policy's table timed (every cause
# by requeue, in-job round and hot spares), and each end's Slurm look-ups; no cluster, ~5 s.
bench-decision: install-python
	$(PY) -m benchmarks.end_decision $(BENCH_FLAGS) --out $(RESULTS)/end_decision.json

# A decision's Slurm look-ups idle and beside 78 busy processes (issue 46), not a test: ~1 min on
# the local cluster; is the kill round's wait at 39 hollow nodes the node count or the cores?
bench-step-probe: install cluster-up
	$(PY) -m benchmarks.step_probe $(BENCH_FLAGS) --out $(RESULTS)/step_probe.json

# Import benchmark (issue 17), not a test: ~30 s; the files `import torch` and `import fairseq`
# open, stat and list (strace -f, installed here when missing), and that times NODES x RANKS.
IMPORT_PYTHON ?= $(PY)
bench-import: install-python
	@command -v strace >/dev/null || { if [[ $$(id -u) == 0 ]]; then apt-get install -y -qq strace; \
	  else sudo apt-get install -y -qq strace; fi; }
	$(PY) -m benchmarks.import_files $(BENCH_FLAGS) --python $(IMPORT_PYTHON) --nodes 64 \
	  --ranks-per-node 8 --out $(RESULTS)/import_files.json
