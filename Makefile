# Every target bootstraps what it needs: the virtualenv (from pyproject.toml) and, through
# scripts/system-deps.sh, the few Debian packages the embedded stack runs on.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JARS := $(VENV)/share/spanner-cdc/jars
JARS_STAMP := $(JARS)/.resolved
# The bench's peer (Debezium), resolved for make bench only: not part of the product.
BENCH_JARS := $(VENV)/share/spanner-cdc/bench-jars
BENCH_JARS_STAMP := $(BENCH_JARS)/.resolved
PYTEST_ARGS ?=
# Two pytest workers: the Spark tests in one, the rest beside them (tests/conftest.py).
PYTEST_WORKERS ?= 2

.PHONY: demo test chaos lint bench clean system-deps

# pyspark_bytecode: Spark's Python processes import PySpark from a zip of sources, compiled again
# by each (about a second); the bytecode added to the zip saves it (docs/consumer.md).
# -qq: pip's errors only. With -q, setuptools' notice box about editable installs (printed for
# every strategy by setuptools 84) opened every fresh clone's output.
# The package's modules in spanner_cdc/**/*.pyx are compiled when it is installed: that needs a C
# compiler and Python's headers, which `system-deps.sh build` checks for (and installs when missing).
$(STAMP): pyproject.toml setup.py spanner_cdc/consumer/spark/pyspark_bytecode.py $(shell find spanner_cdc -name '*.pyx')
	@PYTHON=$(PYTHON) bash scripts/system-deps.sh build
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	$(BIN)/pip install -qq -e '.[dev]'
	$(BIN)/python -m spanner_cdc.consumer.spark.pyspark_bytecode
	touch $(STAMP)

# The JVM artifacts (the Kafka broker, Spark's Kafka connector), by the coordinates in jvm/*/pom.xml.
$(JARS_STAMP): $(STAMP) $(wildcard jvm/*/pom.xml) scripts/jars.sh
	@mkdir -p $(JARS)
	@bash scripts/jars.sh $(JARS)
	@touch $(JARS_STAMP)

$(BENCH_JARS_STAMP): $(JARS_STAMP) bench/debezium/pom.xml bench/spark-avro/pom.xml
	@mkdir -p $(BENCH_JARS)
	@bash scripts/jars.sh $(BENCH_JARS) bench/debezium bench/spark-avro
	@touch $(BENCH_JARS_STAMP)

system-deps:
	@bash scripts/system-deps.sh

demo: system-deps $(STAMP) $(JARS_STAMP)
	$(BIN)/spanner-cdc demo

test: system-deps $(STAMP) $(JARS_STAMP)
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

chaos: system-deps $(STAMP) $(JARS_STAMP)
	CHAOS_SCALE=full $(BIN)/pytest -s -m chaos $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: system-deps $(STAMP) $(JARS_STAMP) $(BENCH_JARS_STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .stack .pytest_cache .mypy_cache .ruff_cache *.egg-info
	rm -f spanner_cdc/schemas/*.c spanner_cdc/schemas/*.so
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
