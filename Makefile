# kiln: bake GPU images, verify them, launch multi-node TensorFlow training.
# `make help` lists the targets; `make demo` and `make test` set everything up themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.kiln-ready
NODES ?= 3

.PHONY: help setup demo test lint unit integration bench clean

help: ## list the targets
	@grep -hE '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

setup: $(READY) ## install system packages (as root), .venv and Horovod (cached)

$(READY): pyproject.toml scripts/setup
	scripts/setup
	@touch $@

demo: setup ## local 3-node cluster: mesh, horovod and tf-config training, result table
	$(PY) scripts/demo --nodes $(NODES)

test: lint unit integration ## everything CI runs

lint: setup ## ruff and shellcheck
	$(VENV)/bin/ruff check .
	shellcheck scripts/setup bootstrap/shim/ssh .ci/run

unit: setup ## pure-code tests (seconds)
	$(PY) -m pytest -q tests/unit

integration: setup ## real sshd nodes in network namespaces, real TensorFlow and Horovod (root)
	$(PY) -m pytest -q -m integration tests/integration

bench: setup ## benchmarks printing ratios (bench/): SSH fan-out, training throughput
	$(PY) bench/fanout.py
	$(PY) bench/throughput.py

clean: ## remove local clusters, runs and the virtual environment
	-scripts/local-cluster down --name kiln
	rm -rf runs $(VENV)
