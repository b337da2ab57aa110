# One entry point for people and CI. `make demo` and `make test` install what they need
# first: uv (from PyPI), the Python environment (uv.lock), the Maven Central jars.
SHELL := /bin/bash
UV_VERSION := 0.13.8
UV := $(shell command -v uv 2>/dev/null || echo $(CURDIR)/.tools/bin/uv)
PY := .venv/bin/python
SETTLE := .venv/bin/settle
MVN := mvn -s jvm/settings.xml -q -B
# uv must never fetch a Python build from outside the package registries.
export UV_PYTHON_DOWNLOADS := never
export GX_ANALYTICS_ENABLED := false
export SPARK_LOCAL_IP := 127.0.0.1
# The test suite runs its own services on other ports and state, never the dev ones.
TEST_ENV := SETTLE_STATE_DIR=$(CURDIR)/.state/test SETTLE_KAFKA_PORT=29092 \
	SETTLE_KAFKA_CONTROLLER_PORT=29192 SETTLE_PG_PORT=25432 SETTLE_KAFKA_BROKERS=3

.PHONY: help setup jvm-archive browser promtool iptables env jars up down status migrate test test-quick test-down lint docs demo \
	airflow bench classifier clean stack-build stack-up stack-wan stack-drill stack-backup stack-restore stack-soak stack-down stack-logs

help:
	@echo "make demo   - the main job end to end on embedded services"
	@echo "make test   - the whole test suite against real Kafka/PostgreSQL/Spark"
	@echo "make test-quick - the tests that need no services (a few minutes)"
	@echo "make docs   - regenerate docs/reference/ (configuration, CLI) from the code"
	@echo "make up | down | status | migrate | lint | bench | clean"
	@echo "make stack-build | stack-up [WAN_RTT_MS=2] | stack-wan WAN_RTT_MS=N | stack-drill [FAULT=site-loss|site-freeze|site-partition|standby-partition|witness-partition SITE=a|point-in-time] DATE=YYYY-MM-DD TRADES=N | stack-backup [TYPE=incr] | stack-restore DATE=D TARGET=T | stack-soak DAYS=3 MINUTES=4 | stack-down"

setup: env jars classifier jvm-archive

# Headless Chromium renders the audit report and drives the Airflow UI in tests.
browser:
	@command -v chromium >/dev/null || { \
	  echo "installing Debian's chromium for the browser tests..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# promtool (Debian's prometheus package) checks and unit-tests the alert rules in the suite
# (tests/test_alert_rules.py fails without it).
promtool:
	@command -v promtool >/dev/null || { \
	  echo "installing Debian's prometheus for promtool..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus >/dev/null; }

# iptables (Debian's package) drops packets on a loopback port of a test's own: a peer gone
# silent (tests/test_failure_detection.py fails without it).
iptables:
	@command -v iptables >/dev/null || { \
	  echo "installing Debian's iptables (the failure-detection tests, the stack's WAN and cuts)..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends iptables >/dev/null; }

$(CURDIR)/.tools/bin/uv:
	python3 -m venv .tools
	.tools/bin/pip install -q uv==$(UV_VERSION)

env: .venv/.synced
.venv/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --compile-bytecode --python 3.11
	@touch $@

jars: .cache/jars/kafka/.done .cache/jars/spark/.done
.cache/jars/kafka/.done: jvm/kafka/pom.xml jvm/settings.xml
	@command -v java >/dev/null || { echo "Java 17 is required (apt-get install openjdk-17-jdk-headless)"; exit 1; }
	@echo "fetching the Kafka broker jars and the JMX exporter agent from Maven Central..."
	rm -rf .cache/jars/kafka .cache/jars/jmx
	$(MVN) -f jvm/kafka/pom.xml package
	@touch $@
.cache/jars/spark/.done: jvm/spark/pom.xml jvm/settings.xml
	@echo "fetching the Spark Kafka connector and PostgreSQL JDBC driver from Maven Central..."
	rm -rf .cache/jars/spark
	$(MVN) -f jvm/spark/pom.xml package
	@touch $@

# The Kafka classifier compiled for the JVM (settlement.spark.jvmclassify), against the Spark
# jars pyspark ships and the Kafka client the connector step fetched. A close without it
# reads with Python workers.
CLASSIFIER_JAR := .cache/jars/classifier/settle-classifier.jar
classifier: $(CLASSIFIER_JAR)
$(CLASSIFIER_JAR): jvm/classifier/settle/KafkaClassifier.java .venv/.synced .cache/jars/spark/.done
	@command -v javac >/dev/null || { echo "javac is required (apt-get install openjdk-17-jdk-headless)"; exit 1; }
	@echo "compiling the JVM Kafka classifier..."
	rm -rf .cache/classifier-build && mkdir -p .cache/classifier-build $(@D)
	javac --release 17 -nowarn -d .cache/classifier-build \
	  -cp "$$($(PY) -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')/jars/*:.cache/jars/spark/*" \
	  jvm/classifier/settle/KafkaClassifier.java
	jar --create --file $@.tmp -C .cache/classifier-build settle && mv $@.tmp $@
	rm -rf .cache/classifier-build

# The close's JVM class archive (settlement.spark.warmup): built by a close of a small day on
# throw-away embedded services, so that a fresh clone's first close maps it instead of paying
# for it (24 s against 8 s for a 2,000-trade day). Never fails the setup: when it cannot run,
# it says why and the first close builds the archive as before.
jvm-archive: .cache/jvm/.warmed
.cache/jvm/.warmed: $(CLASSIFIER_JAR) .cache/jars/spark/.done .venv/.synced
	@mkdir -p $(@D)
	$(PY) -m settlement.spark.warmup
	@touch $@

up: setup
	$(SETTLE) services up
	$(SETTLE) db migrate
down:
	-$(SETTLE) services down
status:
	$(SETTLE) services status
migrate: env
	$(SETTLE) db migrate

# The configuration and CLI references, generated from Settings and the parsers
# (settlement/cli/reference.py); tests/test_reference.py fails when they differ.
docs: env
	$(PY) -m settlement.cli.reference

lint: env
	$(UV) run --frozen ruff check settlement consumers dags tests benchmarks
	$(UV) run --frozen lint-imports

# The suite in two phases on one set of services, started first and stopped last (on
# failure too): most tests in parallel worker processes (one file per worker at a time:
# module fixtures and fixed ports stay in one process), then, alone, the tests marked
# `exclusive` (they stop a shared service or judge a time bound), then, with the embedded
# services stopped, the docker-compose stack scenario (`stack`: make stack-up, stack-drill,
# stack-down; needs root). Each prints its slowest tests; the failures of all three are
# printed again at the end (tests/failures.py). TEST_WORKERS=1 runs the first phase in one
# process.
TEST_WORKERS ?= 2
PYTEST := $(TEST_ENV) $(PY) -m pytest --durations=15 --durations-min=5
# Each phase's results, for the summary of every phase's failures printed last.
JUNIT := .state/test/junit
# The stack phase's engine, Compose and images are built while the first two phases run
# (as root; `nice`, idle I/O class): on a new machine that is most of a first stack-up
# (installing Docker's engine, debootstrap, seven images, Compose from the Go module
# proxy), which would otherwise wait for the suite. NO_STACK_BUILD=1 leaves it to stack-up.
STACK_BUILD_LOG := .state/test/stack-build.log
test: setup browser promtool iptables
	@$(TEST_ENV) $(SETTLE) services up --json >/dev/null
	@$(TEST_ENV) $(SETTLE) db migrate --json >/dev/null
	@rc=0; rm -f $(JUNIT)-*.xml; build=""; \
	if [ "$$(id -u)" -eq 0 ] && [ -z "$(NO_STACK_BUILD)" ]; then \
	  echo "building the stack's engine, Compose and images in the background (lowest priority; log: $(STACK_BUILD_LOG))"; \
	  nice -n 19 ionice -c 3 $(SETTLE) stack build --json >$(STACK_BUILD_LOG) 2>&1 & build=$$!; \
	fi; \
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile -m "not exclusive and not stack" \
	  --junitxml=$(JUNIT)-1-parallel.xml $(PYTEST_ARGS) || { r=$$?; [ $$r -eq 5 ] || rc=$$r; }; \
	$(PYTEST) -m "exclusive and not stack" --junitxml=$(JUNIT)-2-exclusive.xml $(PYTEST_ARGS) \
	  || { r=$$?; [ $$r -eq 5 ] || rc=$$r; }; \
	$(MAKE) --no-print-directory test-down; \
	if [ -n "$$build" ]; then \
	  if wait $$build; then echo "stack images built ahead: $$(tail -n 1 $(STACK_BUILD_LOG))"; \
	  else echo "the stack's early build failed (make stack-up builds again); its log ends:"; \
	    tail -n 20 $(STACK_BUILD_LOG); fi; \
	fi; \
	$(PYTEST) -m stack --junitxml=$(JUNIT)-3-stack.xml $(PYTEST_ARGS) \
	  || { r=$$?; [ $$r -eq 5 ] || rc=$$r; }; \
	$(PY) -m tests.failures $(JUNIT)-*.xml; \
	exit $$rc

# The tests that need no services (contract, parsers and the parity corpus, config, CLI
# errors, calendar, layers and lint, report rendering, capacity model): minutes, not half
# an hour. For the edit-run loop; `make test` before pushing.
test-quick: env promtool
	$(TEST_ENV) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not services" \
	  --durations=10 $(PYTEST_ARGS)

# Stop the test suite's services (the suite stops them itself; this is the safety net).
test-down:
	-@[ -x $(SETTLE) ] && $(TEST_ENV) $(SETTLE) services down --json >/dev/null 2>&1 || true

demo: setup
	$(SETTLE) demo

# The docker-compose deployment on this machine (root: installs and starts Debian's Docker
# engine if none runs, builds the images here, writes .env and the TLS certificates). Each
# prints one JSON object as its last stdout line.
DATE ?= $(shell date +%F)
TRADES ?= 20000
# WAN_RTT_MS: the round trip between site A, site B and the witness (0: direct links).
WAN_RTT_MS ?= 2
stack-up: setup iptables
	$(SETTLE) stack up --wan-rtt-ms $(WAN_RTT_MS) --json
# The running stack's WAN changed in place:
# make stack-wan WAN_RTT_MS=20 [WAN_JITTER_MS=4] [WAN_LOSS=0.001].
stack-wan: env iptables
	$(SETTLE) stack wan --wan-rtt-ms $(WAN_RTT_MS) --wan-jitter-ms $(or $(WAN_JITTER_MS),0) \
	  --wan-loss $(or $(WAN_LOSS),0) --json
# The engine, Compose and every image, nothing started (stack-up does it first anyway).
stack-build: setup
	$(SETTLE) stack build --json
# FAULT=site-loss|site-freeze SITE=a|b: a whole site lost (SIGKILL, then started again) or
# frozen (docker pause past the leases); FAULT=site-partition|standby-partition SITE=a|b: the
# primary's or the standby's site cut off alive (packets dropped), then healed (AT=ingest|close:
# mid-day, or while the site's own close holds the date);
# FAULT=witness-partition: the witness cut off. FAULT=switchover-at-commit: a close frozen
# around its publishing commit while the settlement primary switches over (issue 56's crash
# points on the stack). FAULT=point-in-time: DATE's published rows deleted by mistake as the
# admin, then restored from the backups as of the moment before (make stack-backup first, or it
# takes a full one). Without FAULT, site-a's consumer is killed.
stack-drill: setup
	$(SETTLE) stack drill --date $(DATE) --trades $(TRADES) $(if $(FAULT),--fault $(FAULT) --site $(or $(SITE),a)) $(if $(AT),--at $(AT)) --json
DAYS ?= 3
MINUTES ?= 4
# A backup of the settlement cluster into the repository at the witness (pgBackRest):
# TYPE=full|diff|incr (default incr; full when there is none yet).
stack-backup: setup
	$(SETTLE) stack backup --backup-type $(or $(TYPE),incr) --json
# After a mistaken DELETE of a day's published rows: put them back as they stood at TARGET
# (the moment before, with its zone), from a copy restored at the witness.
stack-restore: setup
	$(SETTLE) stack restore --date $(DATE) --target '$(TARGET)' --json
stack-soak: setup
	$(SETTLE) stack soak --days $(DAYS) --minutes $(MINUTES) --trades $(TRADES) --json
stack-down: env
	$(SETTLE) stack down --json
stack-logs:
	docker compose -p dual-site-settlement logs --tail 200 2>/dev/null || \
	  .cache/stack/docker-compose-* -p dual-site-settlement logs --tail 200

# Airflow's UI on our DAGs and the embedded services (AIRFLOW_PORT=8080 by default).
airflow: setup
	$(PY) -m settlement.orchestration.ui

bench: setup
	$(PY) benchmarks/ingest.py

clean: down
	rm -rf .state reports jvm/*/target
