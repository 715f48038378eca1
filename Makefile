# FiloPy's entry points. `make test` is the README's test command and what CI runs.
SHELL := /bin/bash
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: help demo venv system-deps go-tools services-up services-down services-status lint format test warm-kernels unit bench compliance clean

help:
	@echo "make demo            the main job: a local cluster ingesting, losing a node, recovering"
	@echo "make test            lint, start Kafka + Cassandra, run the whole test suite"
	@echo "make unit            only the tests that need no service"
	@echo "make services-up     start local Kafka (KRaft) and Cassandra (scripts/services.sh)"
	@echo "make services-down   stop them"
	@echo "make bench           run the benchmarks in bench/ (results in bench/results/)"
	@echo "make compliance      PromQL answers compared with Prometheus 3's (tests/compliance)"
	@echo "make lint | format   ruff check / ruff format"

venv: $(VENV)/.installed

# Kafka is fetched and started by the demo itself (scripts/services.sh); the store is SQLite.
demo: venv
	$(BIN)/filopy demo

# Reinstall when the dependencies change; the project itself is installed editable.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

system-deps:
	scripts/system-deps.sh

services-up: venv
	scripts/services.sh up

services-down:
	scripts/services.sh down

services-status:
	scripts/services.sh status

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Four pytest-xdist workers, also on two cores: the many-hosts tests (two workers' at first, each
# with a bed of its own, ~8 minutes) mostly wait out real fault timings. With three workers the
# cores were 85-90 % busy, with four 94-95 % (FILOPY_CPU_BY_TEST=1, tests/cpu_by_test.py): the
# suite is CPU-bound, ~1900 CPU seconds. Bytecode caching on, whatever the environment says: the
# suite starts hundreds of Python processes (Ray workers, the CLI), and without it each compiles
# the project's modules anew; the numba kernels' cache is filled first for the same reason
# (scripts/warm_kernels.py), while the services start: one waits on the JVMs, the other uses a
# core (46 -> 35 s on a fresh clone).
# The JVMs a test run starts (Kafka, Cassandra: here, on the beds, the secured ones) live minutes
# and do little, so C2's compilations never pay back: C1 alone halves their CPU
# (bench/results/jvm_jit.txt). Long-lived services (`make services-up`) and the benchmarks keep
# the JVM's default.
test: export FILOPY_SERVICES_JVM_OPTS ?= -XX:TieredStopAtLevel=1
test: lint system-deps go-tools
	$(MAKE) --no-print-directory --output-sync=target -j2 services-up warm-kernels
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -n 4 --durations=15

warm-kernels: venv
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python scripts/warm_kernels.py

# Outside clients built from the Go module proxy, pinned and cached under .services/cache/: the
# remote-write receiver compliance suite and Prometheus 3 (a remote write 2.0 sender).
go-tools:
	scripts/rw-compliance.sh suite >/dev/null
	scripts/rw-compliance.sh prometheus >/dev/null

# Every test that needs no service (no Kafka, Cassandra, Ray or the many-hosts bed), by marker.
# Two workers (pytest-xdist): the tests are CPU-bound and independent. tests/runtime and
# tests/netbed hold only service tests; collecting the rest imports no Ray (tests/conftest.py).
unit: venv
	@start=$$(date +%s); FILOPY_UNIT_ONLY=1 $(BIN)/pytest -q -n 2 \
	  -m "not kafka and not cassandra and not ray and not netbed" \
	  --ignore=tests/runtime --ignore=tests/netbed; rc=$$?; \
	echo "make unit: $$(( $$(date +%s) - start )) s"; exit $$rc

# FiloPy's PromQL answers against Prometheus 3's on the same data; prints the score and every
# difference, fails on one that tests/compliance/known_differences.yml does not list.
compliance: venv system-deps go-tools services-up
	$(BIN)/python -m tests.compliance.harness

bench: venv
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean: services-down
	rm -rf .services/data .services/logs .services/run .pytest_cache .pytest-cpu .hypothesis
