# genrank: `make demo` runs the pipeline on the simulated demo world; `make test` runs the test suite.
# Both create .venv if missing and install everything they need (Python packages, Java for Spark).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.genrank-installed
export GX_ANALYTICS_ENABLED := false
export MLFLOW_ENABLE_TELEMETRY := false
export DAGSTER_DISABLE_TELEMETRY := true

.PHONY: setup demo test test-quick java dbt-manifest dagster mlflow clean-data prod-up prod-down

setup: $(STAMP) java dbt-manifest

# dbt's manifest, which the Dagster code location loads (re-parsed only when a model changed)
dbt-manifest: $(STAMP)
	$(BIN)/python -c "from transforms.sequences import ensure_manifest; ensure_manifest()"

# The CPU torch wheel goes in first, pinned, so nothing later can pull a multi-GB CUDA build. pip byte-compiles
# what it installs (about 40 s of the install): it pays back, because a run's many processes would otherwise each
# compile every module they import where PYTHONDONTWRITEBYTECODE is set, as on this machine (about 9 s a process).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "Java (needed by Spark) is missing: installing openjdk-17-jre-headless"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq openjdk-17-jre-headless; } || { \
	    echo "could not install Java: install a Java 17 runtime (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) and rerun"; exit 1; }; }

demo: setup
	$(BIN)/genrank demo --preset demo

test: setup
	$(BIN)/python -m pytest

# The inner loop: unit, property and single-component tests; no Spark, no end-to-end run, no stack (pyproject's markers).
test-quick: setup
	$(BIN)/python -m pytest -m "not slow and not spark and not stack"

dagster: setup
	$(BIN)/genrank ui

mlflow: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///$${GENRANK_HOME:-.genrank}/mlflow.db

# The production rehearsal (deploy/stack.py): PostgreSQL, dagster-webserver + dagster-daemon on a Postgres
# instance, an MLflow tracking server, a Spark standalone master + worker, all on 127.0.0.1, state under
# $GENRANK_HOME/stack/. PostgreSQL is installed from Debian when missing.
prod-up: setup
	$(BIN)/genrank stack up

prod-down:
	$(BIN)/genrank stack down

clean-data:
	rm -rf .genrank
