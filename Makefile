# Two entry points for a fresh machine; each prepares the environment first (scripts/setup).
export HF_HUB_OFFLINE := 1
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: setup eval test lint bench dev train-demo

setup:
	@scripts/setup

## The main job: the bundled CartPole eval as a Dagster run on the local instance (.dagster_home/).
eval: setup
	.venv/bin/hud-pipelines run cartpole_pd

## A policy trained here, end to end: expert demonstrations of MetaWorld reach-v3 as a LeRobot dataset,
## lerobot-train (ACT, CPU) and a sweep of every checkpoint on held-out seeds (README: "A trained policy").
train-demo: setup
	.venv/bin/python scripts/train_demo.py

## The Dagster UI with every pipeline in pipelines/ (http://127.0.0.1:3000).
dev: setup
	@.venv/bin/python -c 'from pathlib import Path; from hud_pipelines.cli.run import ensure_dagster_home; ensure_dagster_home(Path.cwd())'
	.venv/bin/dagster dev -w workspace.yaml

## The test suite (what CI runs), on TEST_WORKERS processes (pytest-xdist): most tests wait on sims,
## brokers and workers of their own, so two share two cores well. TEST_WORKERS=0 runs it in one process.
## The slowest tests are listed at the end, to keep the suite fast.
TEST_WORKERS ?= 2
test: setup
	.venv/bin/pytest -q -n $(TEST_WORKERS) --durations=15

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/pyright

bench: setup
	.venv/bin/python bench/wire.py
	.venv/bin/python bench/bridge.py
	.venv/bin/python bench/agent_loop.py
	.venv/bin/python bench/agent.py
	.venv/bin/python bench/remote.py
	.venv/bin/python bench/dataset.py
	.venv/bin/python bench/dagster_overhead.py
	.venv/bin/python bench/sweep.py
	.venv/bin/python bench/lerobot_equality.py
	.venv/bin/python bench/shards.py
