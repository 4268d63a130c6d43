# abstain — developer entry points. `make help` lists them.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help venv run data docs test test-unit test-integration test-long test-kafka4 test-image image lint typecheck check bench replay kafka-start kafka-stop deploy-check clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) ## create .venv and install abstain with its dev tools

run: $(STAMP) ## local Kafka + worker + label desk (URL and login printed) + demo stream (Phishing, 20/s until Ctrl-C) + simulated labeller that leaves a quarter of the requests to you (ARGS="--events 3000": a bounded run; ARGS=--prometheus: also a Prometheus with the alert rules; Ctrl-C stops all)
	$(BIN)/python -m service demo $(ARGS)

# processes the suite runs in (pytest-xdist; each starts its own broker when it needs one,
# a test file stays in one process): TEST_JOBS=0 runs it in this process alone. The tests
# marked `solo` (a worker that must keep up with its traffic) run after, in one process.
TEST_JOBS ?= 2
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

# the broker smoke tests, run again on the Kafka 4 line (make test runs them after the rest)
KAFKA4_SMOKE := tests/integration/test_kafka4.py tests/integration/test_broker.py \
	tests/integration/test_service.py tests/integration/test_producers.py \
	tests/integration/test_unreadable.py

test: $(STAMP) ## unit, doctest and real-Kafka integration tests (Kafka 3.9 in TEST_JOBS=2 processes, then the Kafka 4 smoke subset)
	$(BIN)/python -m pytest -m "not slow and not solo and not image" $(XDIST) $(ARGS)
	$(BIN)/python -m pytest -m "solo and not slow" $(ARGS)
	ABSTAIN_TEST_KAFKA=4 $(BIN)/python -m pytest -m "not slow" $(KAFKA4_SMOKE)

test-kafka4: $(STAMP) ## the broker smoke tests on a Kafka 4 broker only
	ABSTAIN_TEST_KAFKA=4 $(BIN)/python -m pytest -m "not slow" $(KAFKA4_SMOKE) $(ARGS)

test-unit: $(STAMP) ## tests that need no broker
	$(BIN)/python -m pytest -m "not integration and not slow and not image" $(ARGS)

IMAGE ?= localhost/abstain:dev

image: ## build the container image with buildah (no Docker engine; root, apt-get install buildah mmdebstrap): IMAGE=name, BASE_IMAGE=base
	bash deploy/image/build.sh $(IMAGE)

test-image: $(STAMP) ## build the image and run the worker in it against a test broker (marker image, ~3-5 min)
	$(BIN)/python -m pytest -m image tests/image $(ARGS)

test-long: $(STAMP) ## the full-size fault-injection tests and the three-broker cluster faults (tens of minutes)
	$(BIN)/python -m pytest -m slow $(ARGS)

docs: $(STAMP) ## the documentation site into var/site (mkdocs --strict: a broken link or a page missing fails); the reference pages are checked against the code first
	$(BIN)/python -m service.reference --check
	$(BIN)/mkdocs build --strict --quiet

lint: $(STAMP) ## ruff check + format check
	$(BIN)/ruff check service tests loadtest
	$(BIN)/ruff format --check service tests loadtest

typecheck: $(STAMP) ## mypy --strict on service/
	$(BIN)/mypy

check: lint typecheck test ## everything CI runs on the code

bench: $(STAMP) ## learner micro-benchmarks (prints a table)
	$(BIN)/python -m service bench $(ARGS)

data: $(STAMP) ## fetch the benchmarks' datasets from their original sources into var/data (sha256 checked; ARGS="--from DIR": a local copy)
	$(BIN)/python -m service data fetch $(ARGS)

replay: $(STAMP) ## paper protocol (the bare learners: --bare) on Phishing and svmguide1 (make data first): data into loadtest/results/replay/, figures into docs/results/replay/figures/
	$(BIN)/python -m service replay phishing --bare --out loadtest/results/replay/phishing \
		--figures docs/results/replay/figures/phishing $(ARGS)
	$(BIN)/python -m service replay svmguide1 --bare --out loadtest/results/replay/svmguide1 \
		--figures docs/results/replay/figures/svmguide1 $(ARGS)

kafka-start: $(STAMP) ## start the local single-node Kafka on 127.0.0.1:9092 (ARGS="--brokers 3": a cluster; "--kafka 4": Kafka 4)
	$(BIN)/python -m service kafka start $(ARGS)

kafka-stop: $(STAMP) ## stop the local Kafka (every node of a cluster)
	$(BIN)/python -m service kafka stop $(ARGS)

deploy-check: ## static checks: Dockerfile, Helm chart, alerts, dashboard
	bash deploy/check.sh

clean: ## remove caches and local state (not the venv)
	rm -rf var .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
