# gpuwarden — the two commands in the README do all of their own set-up.
#   make demo   venv + install + the demo (no broker needed)
#   make test   venv + install + a local Apache Kafka broker + the whole suite + stop the broker
#   make bench  venv + install + a broker (unless KAFKA_BOOTSTRAP) + bench/run_all.py + stop it

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# The slowest tests end every run: what to look at when the suite nears its budget (CONTRIBUTING.md).
PYTEST_ARGS ?= --durations=25
BENCH_ARGS  ?=

# Debian packages the integration tests run: Prometheus and Alertmanager on loopback, kubectl
# kustomize (kubernetes-client, only where no kubectl is installed), systemd-analyze and openssl (the
# secured-Kafka test makes its CA with it). Installed
# the way `browser` installs Chromium; a missing one skips its tests locally and fails them in CI.
SYSTOOLS := prometheus:prometheus prometheus-alertmanager:prometheus-alertmanager kubectl:kubernetes-client \
            systemd-analyze:systemd openssl:openssl

.PHONY: venv browser systools demo test test-unit kafka-start kafka-stop bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

demo: venv
	$(BIN)/gpuwarden demo

# Headless Chromium for the report-rendering test (tests/integration/test_report_render.py).
# Installed from the distribution's apt when missing (sudo only when not root); where there is
# no apt-get it says so and goes on: the test then skips locally and fails under CI.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
		if command -v apt-get >/dev/null 2>&1; then \
			SUDO=; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
			$$SUDO apt-get update -qq && \
			$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
		else \
			echo "no apt-get here: install Chromium yourself for the report-rendering test" >&2; \
		fi; \
	}

systools:
	@missing=; for t in $(SYSTOOLS); do \
		command -v "$${t%%:*}" >/dev/null 2>&1 || missing="$$missing $${t#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
		if command -v apt-get >/dev/null 2>&1; then \
			SUDO=; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
			$$SUDO apt-get update -qq && \
			$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
		else \
			echo "no apt-get here: install$$missing yourself for the deploy/monitoring tests" >&2; \
		fi; \
	fi

# The broker is started unless KAFKA_BOOTSTRAP points at one already; it is stopped whatever
# the tests did, and the tests' exit status is kept. scripts/pytest-suite runs the unit tests in
# parallel (PYTEST_WORKERS, default one a core), then the broker-backed ones one at a time.
test: venv browser systools
	@if [ -n "$$KAFKA_BOOTSTRAP" ]; then \
		PYTHON=$(BIN)/python scripts/pytest-suite $(PYTEST_ARGS); \
	else \
		PYTHON=$(BIN)/python scripts/kafka start || exit 1; \
		status=0; \
		KAFKA_BOOTSTRAP=127.0.0.1:$${KAFKA_PORT:-9092} PYTHON=$(BIN)/python scripts/pytest-suite $(PYTEST_ARGS) || status=$$?; \
		scripts/kafka stop; \
		exit $$status; \
	fi

# The whole benchmark suite (bench/run_all.py): JSON under bench/results/ and the generated
# section of docs/performance.md. BENCH_ARGS=--quick for a smoke run (it leaves the doc alone).
bench: venv
	@if [ -n "$$KAFKA_BOOTSTRAP" ]; then \
		$(BIN)/python bench/run_all.py $(BENCH_ARGS); \
	else \
		PYTHON=$(BIN)/python scripts/kafka start || exit 1; \
		status=0; \
		KAFKA_BOOTSTRAP=127.0.0.1:$${KAFKA_PORT:-9092} $(BIN)/python bench/run_all.py $(BENCH_ARGS) || status=$$?; \
		scripts/kafka stop; \
		exit $$status; \
	fi

# The unit tests without the slow ones (pyproject.toml's markers): the quick loop while editing.
test-unit: venv
	$(BIN)/python -m pytest -n $${PYTEST_WORKERS:-auto} tests/unit -m "not slow" $(PYTEST_ARGS)

kafka-start: venv
	PYTHON=$(BIN)/python scripts/kafka start

kafka-stop:
	scripts/kafka stop

clean:
	rm -rf $(VENV) .pytest_cache .kafka build *.egg-info
