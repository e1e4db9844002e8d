# SAT: the two commands are `make demo` and `make test`; both create .venv from the lock file.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# make test runs the suite in two worker processes (pytest-xdist), a test file per worker at a
# time so that module fixtures (the running service of tests/e2e/test_service.py) stay in one,
# in collection order (--no-loadscope-reorder: xdist would sort files by their number of tests,
# which sent the long one-test files last; tests/conftest.py collects the longest first).
# Three workers on the two cores took longer (CI run 14: 22 vs 19-20 min).
TEST_WORKERS ?= 2

export AIRFLOW_HOME := $(CURDIR)/.airflow
export AIRFLOW_CONFIG := $(CURDIR)/airflow.cfg
export GX_ANALYTICS_ENABLED := false
export DS_BUILD_OPS := 0

.PHONY: demo test test-slow up down benchmarks vendor system-deps clean lock image lint

# The virtual environment, (re)built when the lock file or pyproject is newer than it.
# uv installs (parallel downloads and byte-compilation; pip took ~3.5 of CI's 20 minutes). Keep
# --compile-bytecode: this machine sets PYTHONDONTWRITEBYTECODE=1, so without it every process
# compiles every module it imports, every time (CI run 17 ran at a third of the speed).
# torch first (the pinned CPU wheel, from the machine's wheel folder where it has one), then
# the lock with its hashes, without build isolation so that packages which build against
# torch (deepspeed) see it instead of fetching another.
UV_VERSION := 0.13.8
UV := $(VENV)/bin/uv
WHEELS := $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS),$(if $(wildcard /opt/wheels),--find-links /opt/wheels))
$(VENV)/.installed: requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@test -x $(UV) || $(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(UV) pip install -q --python $(PY) $(WHEELS) setuptools==84.2.1 wheel==0.48.0 torch==2.13.0
	$(UV) pip install -q --python $(PY) $(WHEELS) --require-hashes --no-build-isolation --compile-bytecode -r requirements.lock
	$(UV) pip install -q --python $(PY) --no-deps --no-build-isolation -e .
	@touch $@

.venv: $(VENV)/.installed
	@touch $@

# Debian's registry server (and htpasswd) for the image-check tests against a real registry,
# Debian's chromium for the browser tests (Playwright drives /usr/bin/chromium: no browser download),
# Debian's PostgreSQL server for `sat up --db postgres` and the service tests that run on it, and
# the container tools: podman with runc (the local backend's container runtime), buildah and
# debootstrap (`make image`), uidmap, slirp4netns and fuse-overlayfs (user namespaces, networks), and
# iproute2's ip with util-linux's nsenter (a multi-node container attempt's own network, ADR 0035).
# runc and debootstrap live in /usr/sbin, which a non-root PATH may lack.
SYSTEM_TOOLS := docker-registry htpasswd chromium podman buildah runc debootstrap newuidmap slirp4netns fuse-overlayfs \
  ip nsenter
system-deps:
	@missing=; for tool in $(SYSTEM_TOOLS); do PATH="$$PATH:/usr/sbin:/sbin" command -v $$tool >/dev/null || missing=1; done; \
	  test -z "$$missing" && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      docker-registry apache2-utils chromium postgresql \
	      podman buildah runc debootstrap uidmap slirp4netns fuse-overlayfs iproute2 util-linux >/dev/null; }

# The training image (docker/training.Dockerfile, CPU variant), built on this host from a
# debootstrapped Debian base with podman's and buildah's project configuration
# (sat_tasks/backends/local/image_build.py), tagged as the image the demo spec names, in the
# project's store (.sat/containers). The stamp makes it a no-op while no source changed and its
# image is still in the store. Cold (with the Debian base) 3-8 min here, a rebuild with cached
# layers seconds. While `sat up` runs, the image is pushed to its embedded registry too (ADR 0042;
# otherwise the next `sat up` pushes it). `make test`, `make test-slow` and `make up` build it where podman is installed,
# at recipe time, after system-deps (which installs podman); `make demo` does not need it.
IMAGE_STAMP := .sat/containers/image.stamp
IMAGE_SOURCES := docker/training.Dockerfile docker/training.Dockerfile.dockerignore requirements.lock \
  sat_tasks/backends/local/image_build.py $(shell find ckpt_engine -name '*.py' -not -path '*/__pycache__/*')
IMAGE_IF_PODMAN = @if command -v podman >/dev/null; then $(MAKE) --no-print-directory image; \
  else echo "podman is not installed: no training image (make system-deps installs it)"; fi

image: .venv system-deps
	@$(PY) -m sat_tasks.backends.local.image_build --stamp $(IMAGE_STAMP) --drop-stale-stamp
	@$(MAKE) --no-print-directory $(IMAGE_STAMP)
	@$(PY) -m sat_tasks.service.registry push

$(IMAGE_STAMP): $(IMAGE_SOURCES) | .venv
	$(PY) -m sat_tasks.backends.local.image_build --stamp $@

demo: .venv
	$(VENV)/bin/sat demo

# The gates `make test` runs first (issue 46.5): ruff ([tool.ruff]), the import contracts with every
# installed backend (tests/support/import_contracts.py), and mypy ([tool.mypy]). Seconds each.
lint: .venv
	$(VENV)/bin/ruff check --output-format concise sat_tasks ckpt_engine tests dags plugins
	$(PY) -m tests.support.import_contracts
	$(VENV)/bin/mypy

test: .venv system-deps lint
	$(IMAGE_IF_PODMAN)
	$(PY) -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# SAT as a service on this host: embedded Object Storage, metadata DB, API server (UI and
# REST API on http://127.0.0.1:8080), scheduler, DAG processor. Ctrl-C or `make down` stops it.
# The metadata DB is a private PostgreSQL cluster (`make system-deps` installs the server; issue
# 48.2: SQLite lost the service to "database is locked" under a burst); DB=sqlite for SQLite.
up: .venv system-deps
	$(IMAGE_IF_PODMAN)
	$(VENV)/bin/sat up $(if $(DB),--db $(DB))

down:
	@test -x $(VENV)/bin/sat || { echo "nothing to stop: no .venv"; exit 0; }
	$(VENV)/bin/sat down

test-slow: .venv system-deps
	$(IMAGE_IF_PODMAN)
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

# Benchmarks print ratios side by side; they are not part of `make test`.
benchmarks: .venv
	PYTHONPATH=$(CURDIR) $(PY) tests/benchmarks/bench_dag_parse.py
	PYTHONPATH=$(CURDIR) $(PY) tests/benchmarks/bench_staging.py --rtt-ms 20
	PYTHONPATH=$(CURDIR) $(PY) tests/benchmarks/ckpt_overhead.py --dir build/bench-ckpt-overhead
	PYTHONPATH=$(CURDIR) $(PY) tests/benchmarks/ckpt_io.py --dir build/bench-ckpt-io
	PYTHONPATH=$(CURDIR) $(PY) tests/benchmarks/ckpt_many_tensors.py --dir build/bench-ckpt-many-tensors
	PYTHONPATH=$(CURDIR) $(PY) tests/benchmarks/bench_goodput.py
	PYTHONPATH=$(CURDIR) $(PY) tests/benchmarks/bench_service.py

# The Training Jobs list at 10, 100 and 1,000 runs beside Airflow's own run list (ADR 0022; ~10 min).
.PHONY: bench-jobs-list
bench-jobs-list: .venv
	PYTHONPATH=$(CURDIR) $(PY) tests/benchmarks/bench_jobs_list.py

vendor: .venv
	$(VENV)/bin/sat vendor build/checkpoint_vendor

# Regenerate requirements.lock (every package pinned, with hashes) from pyproject.toml's
# dependencies and extras. torch is the CPU wheel that lies on this machine (/opt/wheels),
# so its hash is that file's; deepspeed's metadata is built against the venv's torch.
lock:
	@test -x $(UV) || $(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	DS_BUILD_OPS=0 $(UV) pip compile pyproject.toml --extra all --generate-hashes \
	  --python-version 3.11 --python-platform x86_64-manylinux_2_28 --find-links /opt/wheels \
	  --override lock-overrides.txt --no-build-isolation-package deepspeed --python $(PY) \
	  --no-header -o requirements.lock

clean:
	rm -rf .airflow .sat build
