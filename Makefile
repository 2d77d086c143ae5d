# The two commands a newcomer needs:  make run   |   make test
# Each sets up what it needs on a fresh machine: a Python 3.11 virtualenv with the project
# installed, Redis (installed from the OS packages and started if nothing listens), a JRE for
# PySpark, and for the tests PostgreSQL as well.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export DEBIAN_FRONTEND := noninteractive
REDIS_URL ?= redis://127.0.0.1:6379/0
# The tests are independent: one pytest-xdist worker per core (set PYTEST_ARGS to override);
# a module marked xdist_group runs whole on one worker.
PYTEST_ARGS ?= -n auto --dist loadgroup
export REDIS_URL
# A test run starts ~1,500 Python processes: with PYTHONDONTWRITEBYTECODE set (some shells and
# CI images set it) each compiles again every project module it imports, ~0.3 CPU-s of each
# Daphne start. The __pycache__ directories it leaves are ignored by git.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help run test test-fast coverage bench lint ruff imports services postgres browser \
	xmpp-clients gnupg python-deps clean cluster-deps cluster cluster-stop test-cluster \
	cluster-tests

help:
	@echo "make run    - set up and run the whole broker (admin :8000, SMQP :$${SMQP_PORT:-720})"
	@echo "make test   - set up and run the test suite"
	@echo "make test-fast - the unit tests only (no process, no socket to the broker): the inner loop"
	@echo "make coverage  - the test suite under coverage, server processes included; report in var/coverage"
	@echo "make bench  - run the benchmarks"
	@echo "make cluster / cluster-stop - a 3-node cluster on this machine (root; docs/cluster.md)"
	@echo "make test-cluster - the kill and partition tests on that cluster (root)"

# Install OS packages by name, running apt-get update once first.
define apt_install
	if ! [ -f /tmp/.smqp-apt-updated ]; then $(SUDO) apt-get update -qq && touch /tmp/.smqp-apt-updated; fi; \
	$(SUDO) apt-get install -y -qq $(1) >/dev/null
endef

$(STAMP): pyproject.toml
	@if ! command -v python3.11 >/dev/null 2>&1 && ! python3 -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then \
	  echo "installing Python 3.11"; $(call apt_install,python3.11 python3.11-venv); fi
	@if [ ! -x $(PY) ]; then \
	  py=$$(command -v python3.11 || command -v python3); echo "creating $(VENV) with $$py"; \
	  $$py -m venv $(VENV) || { $(call apt_install,python3-venv); $$py -m venv $(VENV); }; fi
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

python-deps: $(STAMP)

services: python-deps
	@# Redis: the channel layer, the Celery broker and the shared cache.
	@if ! $(PY) -c "import redis,os; redis.Redis.from_url(os.environ['REDIS_URL'], socket_timeout=2).ping()" 2>/dev/null; then \
	  command -v redis-server >/dev/null || { echo "installing redis-server"; $(call apt_install,redis-server); }; \
	  port=$$($(PY) -c "import os,urllib.parse as u; print(u.urlparse(os.environ['REDIS_URL']).port or 6379)"); \
	  mkdir -p var; echo "starting redis-server on 127.0.0.1:$$port"; \
	  redis-server --daemonize yes --bind 127.0.0.1 --port $$port --save "" --appendonly no \
	    --dir "$$PWD/var" --logfile "$$PWD/var/redis.log"; \
	  for i in $$(seq 50); do $(PY) -c "import redis,os; redis.Redis.from_url(os.environ['REDIS_URL']).ping()" 2>/dev/null && break; sleep 0.1; done; fi
	@# A JRE for the PySpark report jobs.
	@command -v java >/dev/null || { echo "installing a JRE for PySpark"; $(call apt_install,default-jre-headless); }

postgres:
	@# PostgreSQL: the test suite runs its end-to-end tests on it as well as on SQLite.
	@if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then \
	  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then echo "installing PostgreSQL"; $(call apt_install,postgresql); fi; \
	  ver=$$(ls /etc/postgresql | sort -V | tail -1); echo "starting PostgreSQL $$ver"; \
	  $(SUDO) pg_ctlcluster --skip-systemctl-redirect $$ver main start || true; \
	  for i in $$(seq 100); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done; fi

browser:
	@# Headless Chromium and its driver for the admin console's browser test (Debian packages).
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { echo "installing chromium"; $(call apt_install,chromium chromium-driver); }

# GnuPG for the README's QQP walkthrough (a signing key made with gpg), run by the tests.
gnupg:
	@command -v gpg >/dev/null || { echo "installing gnupg"; $(call apt_install,gnupg); }

# The XMPP door's independent clients (@xmpp/client, stanza), pinned by package-lock.json.
xmpp-clients:
	@command -v npm >/dev/null || { echo "installing Node.js and npm"; $(call apt_install,nodejs npm); }
	@[ -d tests/xmpp_clients/node_modules/stanza ] || (cd tests/xmpp_clients && npm ci --no-audit --no-fund)

run: services
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput -v 0
	$(PY) manage.py bootstrapadmin
	exec $(PY) manage.py runbroker

lint: ruff imports

ruff: python-deps
	$(VENV)/bin/ruff check .

# The layer contracts in pyproject.toml ([tool.importlinter]): each layer imports only those below.
imports: python-deps
	$(VENV)/bin/lint-imports --no-cache --no-logo

# The suite, and beside it the cluster's kill and partition tests: a cluster of their own in
# network namespaces, on addresses, ports and databases the suite does not use. Their output
# goes to var/cluster-tests.log, printed once both are done. CLUSTER_TESTS=0 leaves them out.
# The cluster step runs at a lower CPU priority (CLUSTER_NICE): the suite, the longer of the
# two, gets the CPU first, and the cluster step's ~450 CPU-seconds the time the suite leaves idle.
CLUSTER_TESTS ?= 1
CLUSTER_NICE ?= 10
# A run stopped half-way (the trap below) leaves no cluster behind: the next `up` would refuse.
CLUSTER_DOWN = SMQP_CLUSTER_DIR=$${SMQP_CLUSTER_DIR:-/tmp/smqp-cluster-test} $(SUDO) $(PY) -m deploy.local down
test: services postgres lint browser xmpp-clients gnupg cluster-deps
	@# pytest exits 5 when it collected no test: that is a failure here, not a pass.
	@mkdir -p var; rc=0; crc=0; cluster=; \
	if [ "$(CLUSTER_TESTS)" = 1 ]; then \
	  setsid nice -n $(CLUSTER_NICE) $(MAKE) --no-print-directory cluster-tests \
	    > var/cluster-tests.log 2>&1 & cluster=$$!; \
	  trap '[ -z "$$cluster" ] || { kill -TERM -- -$$cluster; wait $$cluster; $(CLUSTER_DOWN); } \
	    >/dev/null 2>&1 || true' EXIT INT TERM; \
	  echo "the cluster tests run beside the suite (log: var/cluster-tests.log)"; fi; \
	$(PY) -m pytest $(PYTEST_ARGS) -m "not cluster" || rc=$$?; \
	if [ -n "$$cluster" ]; then \
	  wait $$cluster || crc=$$?; cluster=; \
	  echo "---- the cluster tests (var/cluster-tests.log), exit status $$crc"; \
	  cat var/cluster-tests.log; fi; \
	if [ $$rc -eq 5 ]; then echo "FAIL: pytest collected no tests"; exit 1; fi; \
	[ $$rc -eq 0 ] || exit $$rc; exit $$crc

# The cluster on one machine (docs/cluster.md): Patroni + etcd, Redis Sentinel, HAProxy and
# PostgreSQL's server binaries from the OS packages; their own instances on a bridge address,
# never the machine's PostgreSQL or Redis.
cluster-deps: python-deps
	@for tool in patroni:patroni etcd:etcd-server haproxy:haproxy redis-sentinel:redis-sentinel \
	  redis-server:redis-server; do command -v $${tool%%:*} >/dev/null || missing="$${missing:-} $${tool#*:}"; done; \
	  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null || missing="$${missing:-} postgresql"; \
	  if [ -n "$${missing:-}" ]; then echo "installing$$missing"; $(call apt_install,$$missing); fi

# CLUSTER_ARGS=--spark adds a Spark standalone cluster of the nodes (runreport --master).
CLUSTER_ARGS ?=
cluster: cluster-deps
	$(SUDO) $(PY) -m deploy.local up $(CLUSTER_ARGS)

cluster-stop: python-deps
	$(SUDO) $(PY) -m deploy.local down

# Kill and partition tests on a cluster of their own (marker: cluster); it is removed after.
test-cluster: cluster-deps lint cluster-tests

cluster-tests:
	rc=0; $(SUDO) $(PY) -m pytest -p no:xdist -m cluster tests/e2e/cluster $(CLUSTER_PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "FAIL: pytest collected no tests"; exit 1; fi; exit $$rc

# The unit tests (tests/unit: no server process), for the inner loop: property and fuzz tests
# at half their example counts (tests/support/examples.py); `make test` runs them in full.
test-fast: services
	rc=0; SMQP_HYPOTHESIS_SCALE=$${SMQP_HYPOTHESIS_SCALE:-0.5} $(PY) -m pytest $(PYTEST_ARGS) tests/unit || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "FAIL: pytest collected no tests"; exit 1; fi; exit $$rc

# The suite under coverage ([tool.coverage] in pyproject.toml): the processes the tests start
# are measured too (patch = subprocess); text report here, HTML in var/coverage/html.
# COVERAGE_ARGS picks tests (default: all); a failing test still leaves a report.
COVERAGE_ARGS ?=
coverage: services postgres browser xmpp-clients
	rm -rf var/coverage && mkdir -p var/coverage
	rc=0; $(PY) -m coverage run -m pytest $(PYTEST_ARGS) $(COVERAGE_ARGS) || rc=$$?; \
	$(PY) -m coverage combine -q; \
	$(PY) -m coverage report | tee var/coverage/report.txt; \
	$(PY) -m coverage html -q -d var/coverage/html; exit $$rc

bench: services postgres
	@# RabbitMQ's HTTP API is the reference of `python -m bench rest` (management plugin).
	@command -v rabbitmq-plugins >/dev/null && $(SUDO) rabbitmq-plugins enable rabbitmq_management >/dev/null 2>&1 || true
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .hypothesis *.egg-info

# The overview's charts: Chart.js from npm, its UMD build and licence copied into the static
# files (committed, so neither `make run` nor `make test` needs npm). Run to upgrade it.
CHARTJS_VERSION ?= 4.4.7
.PHONY: vendor-chartjs
vendor-chartjs:
	tmp=$$(mktemp -d) && cd $$tmp && npm pack --silent chart.js@$(CHARTJS_VERSION) >/dev/null && \
	  tar xzf chart.js-$(CHARTJS_VERSION).tgz && \
	  cp package/dist/chart.umd.js $(CURDIR)/broker/static/ops/vendor/chart.umd.js && \
	  cp package/LICENSE.md $(CURDIR)/broker/static/ops/vendor/chart.js-LICENSE.md && \
	  rm -rf $$tmp
