# kiln: bake GPU images, verify them, launch multi-node TensorFlow training.
# `make help` lists the targets; `make demo` and `make test` set everything up themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
READY := $(VENV)/.kiln-ready
# Python keeps the bytecode of what it imports in the environment's pycache/, not beside the sources, and keeps it
# even where the shell says PYTHONDONTWRITEBYTECODE=1 (as CI's does): there every process compiled all it imported
# again, TensorFlow's 1,800 modules 2 CPU-s a time, the CLI, Ansible and pytest's workers theirs.
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE
NODES ?= 3
PROVIDER ?= local
PROFILE ?=
HOSTS ?=
VARS ?=
REGISTRY ?=
# A matrix file (matrices/) whose entries replace the version matrix's for one bake, e.g. an older TensorFlow.
MATRIX ?=
# pytest-xdist workers for make integration (each module whole in one worker: tests/integration's conftest); 0 runs
# the modules one after another.
WORKERS ?= 0
# pytest-xdist workers for make suites (make test): the integration modules and the local bake's tests in one pool,
# the longest first. Four on a 2-core machine: with two, the cores idled 15% of a whole run (both workers waiting on
# timers, handshakes, a node's start at once: 85% busy, 1572 s); a third filled most of that (1439 s then; 1565 s
# once the queue's and the docs' tests came), a fourth the rest (1459 s with the same tests), though each test
# takes longer.
POOL ?= 4

.PHONY: help setup matrix-env demo test test-fast checks lint docs unit integration validate image verify image-test suites image-test-gpu matrix-check bench clean

help: ## list the targets
	@grep -hE '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

setup: $(READY) ## install system packages (as root), .venv and Horovod (cached)

$(READY): pyproject.toml scripts/setup
	scripts/setup
	@touch $@

matrix-env: setup ## with MATRIX=FILE: .venv-NAME, the Python environment an image gets with that file's entries (TensorFlow, a Horovod built for it; none where the file changes only PyTorch and JAX: .venv serves)
	@[ -n "$(MATRIX)" ] || { echo "make matrix-env: give MATRIX=FILE (matrices/)" >&2; exit 2; }
	MATRIX=$(MATRIX) scripts/setup

demo: setup ## local 3-node cluster: mesh, horovod and tf-config training, result table
	$(PY) -m bootstrap.demo --nodes $(NODES)

# The checks (validate beside unit: about 85 CPU-s) run beside the suites, niced, and their output is printed whole
# when each ends; where one fails, make test fails once the suites end. The suites keep 2 cores 95-100% busy from
# their first minute to their last (.ci/run's table), so this saves what the checks' own minute used to add.
test: setup ## everything CI runs: lint and docs, then the suites with validate and unit beside them (.ci/run prints how long each stage took)
	@$(MAKE) --no-print-directory lint docs
	@$(MAKE) --no-print-directory -j2 suites checks

# validate (mostly one process at a time: packer, ansible-lint) beside unit (two workers), at a lower priority
# (nice 10: the suites' processes, some of them timed, go first): two jobs of their own, not slots of make test's
# jobserver (its flags kept, its -j and jobserver left out).
checks: setup
	@MAKEFLAGS='$(filter-out -j% --jobserver-auth=% --jobserver-fds=%,$(MAKEFLAGS))' nice -n 10 \
		$(MAKE) --no-print-directory -j2 --output-sync=target validate unit UNIT_ARGS="$(VALIDATE_TESTS:%=--ignore=%)"

test-fast: setup ## the inner loop (a few minutes): lint, docs, unit, and the integration modules marked quick; says what it left out
	$(VENV)/bin/ruff check .
	@$(MAKE) --no-print-directory docs
	$(PY) -m pytest -q -n 2 tests/unit
	$(PY) -m pytest -q -m "integration and quick" -n 3 tests/integration
	@echo "make test-fast left out: shellcheck and make validate (the bake's static checks), the integration modules" \
	  "not marked quick (clusters training, the container bake, managed recovery: make integration), the local bake" \
	  "(make image-test); make test runs them all"

# With KILN_STAGE_LOG set (.ci/run sets it), each stage of make test notes when it began and ended.
stage_begin = @[ -z "$(KILN_STAGE_LOG)" ] || echo "$@ begin $$(date +%s)" >>"$(KILN_STAGE_LOG)"
stage_end = @[ -z "$(KILN_STAGE_LOG)" ] || echo "$@ end $$(date +%s)" >>"$(KILN_STAGE_LOG)"

# Every shell script kiln keeps (found by its #! line, so none is missed); ruff finds every *.py itself.
SHELL_SCRIPTS = $(shell git ls-files -co --exclude-standard | while read -r f; do \
	[ -f "$$f" ] && head -1 "$$f" | grep -qE '^\#!.*\b(ba)?sh\b' && echo "$$f"; done)

lint: setup ## ruff over every Python file, shellcheck over every shell script
	$(stage_begin)
	$(VENV)/bin/ruff check .
	shellcheck $(SHELL_SCRIPTS)
	$(stage_end)

# The documentation site (docs/, mkdocs.yml) into site/, which git ignores: strict, so a warning, a page left out of
# the nav or a link to a missing page or heading fails it. Material's end-of-life notice (May 2027) is said once in
# docs/development.md's dependency table, not on every build.
docs: setup ## build the documentation site: mkdocs build --strict into site/ (seconds)
	$(stage_begin)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site
	$(stage_end)

# The unit modules make validate runs too (packer validate of every source among them): make test's unit leaves
# them to validate.
VALIDATE_TESTS = tests/unit/test_image_matrix.py tests/unit/test_packer_templates.py
# ... but for the one that runs bake.validate again, as validate's first step did.
VALIDATE_AGAIN = tests/unit/test_packer_templates.py::test_packer_validate_passes_for_all_five_sources
UNIT_ARGS ?=

unit: setup ## pure-code tests (seconds)
	$(stage_begin)
	$(PY) -m pytest -q -n 2 $(UNIT_ARGS) tests/unit
	$(stage_end)

integration: setup ## real sshd nodes in network namespaces, real TensorFlow and Horovod (root); WORKERS=N modules side by side
	$(stage_begin)
	$(PY) -m pytest -q -m integration -n $(WORKERS) --durations=20 tests/integration
	$(stage_end)

validate: setup ## static checks of the bake: packer fmt and validate (4 sources), ansible-lint, syntax, role specs
	$(stage_begin)
	$(PY) -m bake.validate
	cd ansible && ANSIBLE_CONFIG=ansible.cfg ../$(VENV)/bin/ansible-playbook -i localhost, --syntax-check image.yml cleanup.yml
	cd ansible && ../$(VENV)/bin/ansible-lint --profile production --offline -q
	$(PY) -m pytest -q $(VALIDATE_TESTS) --deselect $(VALIDATE_AGAIN)
	$(stage_end)

image: validate $(if $(and $(MATRIX),$(filter local docker,$(PROVIDER))),matrix-env) ## bake: PROVIDER=aws|gcp|azure|local (default)|docker, PROFILE=gpu|cpu, VARS=my.pkrvars.hcl, REGISTRY=host:port (docker: push), MATRIX=matrices/F.yml; reuses an unchanged one
	$(PY) -m bake.image $(PROVIDER) $(if $(PROFILE),--profile $(PROFILE)) $(foreach f,$(VARS),--var-file $(f)) \
		$(if $(REGISTRY),--registry $(REGISTRY)) $(if $(MATRIX),--matrix $(MATRIX))

verify: setup ## testinfra suite: HOSTS=ssh://user@host,...; without HOSTS, the newest local image: its disk read here (root), then it booted
	$(PY) -m bake.verify $(if $(HOSTS),--hosts $(HOSTS)) $(if $(MATRIX),--matrix $(MATRIX))

image-test: setup ## bake the local image for real (qemu, TCG; kept in the cache, baked again when its inputs change), boot it, run the suite and a container, re-run the playbook (slow)
	$(stage_begin)
	$(PY) -m pytest -q -m image_bake --timeout=5400 --durations=0 tests/image/test_bake_local.py tests/image/test_local_vm.py
	$(stage_end)

# make suites shuffles each module's tests (tests/integration/conftest.py) from SHUFFLE_SEED, one order that a
# whole run passed (fixed, so CI's order changes only with the tests themselves): KILN_TEST_SHUFFLE=SEED draws
# another (the header names it), KILN_TEST_SHUFFLE= runs the written order.
SHUFFLE_SEED ?= e77751ccbe4c

suites: setup ## make integration and make image-test in one pool of POOL workers, the longest module first, shuffled (make test)
	$(stage_begin)
	KILN_TEST_SHUFFLE=$${KILN_TEST_SHUFFLE-$(SHUFFLE_SEED)} $(PY) -m pytest -q -m "integration or image_bake" \
		-n $(POOL) --durations=20 tests/image/test_bake_local.py tests/image/test_local_vm.py tests/integration
	$(stage_end)

image-test-gpu: setup ## image-test, then the gpu profile twice on the baked VM against the stand-in repositories (slower)
	$(PY) -m pytest -q -m image_bake --timeout=7200 tests/image

matrix-check: setup ## is the version matrix current? each pin's newest release in its line and overall (reads PyPI and NVIDIA's repositories; not in CI)
	$(PY) -m bake.matrix_check

bench: setup ## benchmarks printing ratios (bench/): SSH fan-out, training throughput (bare and in the container image), the queue from zero, the local bake
	$(PY) bench/fanout.py
	$(PY) bench/throughput.py --image
	$(PY) bench/slurm_queue.py
	$(PY) bench/local_bake.py

clean: ## remove local clusters, runs and the virtual environment
	-$(PY) -m localcloud.cluster down --name kiln
	rm -rf runs images .packer-compat site $(VENV)
