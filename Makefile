# Two entry points for a fresh machine; each prepares the environment first (scripts/setup).
export HF_HUB_OFFLINE := 1
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: setup eval test lint bench

setup:
	@scripts/setup

## The main job: evaluate the bundled CartPole pipeline end to end.
eval: setup
	.venv/bin/hud-pipelines demo

## The test suite (what CI runs).
test: setup
	.venv/bin/pytest -q

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/pyright

bench: setup
	.venv/bin/python bench/wire.py
