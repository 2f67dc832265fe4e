# Two commands for a fresh machine: `make demo` (the autonomic demo) and `make test` (the suite).
# Set-up is idempotent: the venv is rebuilt only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup setup-test sysdeps dev-secrets bench-sysdeps bench-peers demo test test-e2e test-e2e-waiting test-e2e-rest test-all test-fast bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch==2.13.0 is pinned in pyproject.toml: pip takes the CPU wheel on this machine.
$(VENV)/.installed-core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[demo]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev,alibi,demo,k8s]'
	touch $@ $(VENV)/.installed-core

setup: $(VENV)/.installed-core

setup-test: $(VENV)/.installed-test sysdeps

# Debian tools some tests use (compose file parser, a throwaway PostgreSQL); tests skip with a reason where absent.
# Each install is tried from the package lists as they are, then once more after `apt-get update` (a
# fresh container has none). kubectl (for `kubectl kustomize`) is not a Debian package: only a note.
# PG_BINDIRS: where Debian puts PostgreSQL's programs (initdb is not on PATH there).
PG_BINDIRS ?= /usr/lib/postgresql/*/bin
sysdeps:
	@command -v docker-compose >/dev/null 2>&1 || \
	  (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	   (apt-get install -y -qq docker-compose >/dev/null 2>&1 || \
	    (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq docker-compose >/dev/null 2>&1)) || \
	   echo "note: docker-compose not installed; the compose test will skip")
	@command -v initdb >/dev/null 2>&1 || ls $(PG_BINDIRS)/initdb >/dev/null 2>&1 || \
	  (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	   (apt-get install -y -qq postgresql >/dev/null 2>&1 || \
	    (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq postgresql >/dev/null 2>&1)) || \
	   echo "note: postgresql not installed; tests/postgres will skip")
	@command -v kubectl >/dev/null 2>&1 || \
	  echo "note: kubectl not installed; the kustomize tests (tests/kubernetes) will skip"

# The dev overlay's Secret comes from deploy/overlays/dev/secrets.env (random values, never committed).
dev-secrets: $(VENV)/.installed-core
	PYTHON=$(BIN)/python sh deploy/overlays/dev/gen-secrets.sh

# Debian tools the serving benchmark uses: wrk (the load generator; without it an asyncio generator
# stands in) and haproxy (Ray Serve's high-throughput ingress; without it Ray runs its default proxy).
bench-sysdeps:
	@for t in wrk haproxy; do command -v $$t >/dev/null 2>&1 || \
	  (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	   (apt-get install -y -qq $$t >/dev/null 2>&1 || \
	    (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq $$t >/dev/null 2>&1)) || \
	   echo "note: $$t not installed (see benchmarks/serving.py)"); done

# The servers benchmarks/serving.py measures ours against, each in its own environment under
# .bench-peers/ (never the project's venv: their pins conflict with ours), at the versions measured
# (benchmarks/peers/*.txt). Rebuilt only when its requirements change.
PEERS := .bench-peers
$(PEERS)/%/.installed: benchmarks/peers/%.txt
	rm -rf $(PEERS)/$*
	$(PYTHON) -m venv $(PEERS)/$*
	$(PEERS)/$*/bin/python -m pip install -q -r $<
	touch $@

bench-peers: bench-sysdeps $(PEERS)/mlserver/.installed $(PEERS)/ray/.installed

demo: setup
	$(BIN)/scanflow demo

# pytest exits 5 when it collects no test: treat that as a failure to notice, not a crash.
PYTEST_RUN = rc=0; $(BIN)/python -m pytest -q -ra $(1) $(PYTEST_ARGS) || rc=$$?; \
  if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The suite without the whole-stack scenario tests (7-18 min on 2 cores); test-e2e runs those (the `e2e`
# mark, tests/conftest.py: S1/S2/S4 stacks, reliability, demo CLI, notebooks). CI runs both (.ci/run).
test: setup-test
	@$(call PYTEST_RUN,-m "not e2e")

test-e2e: setup-test
	@$(call PYTEST_RUN,-m e2e)

# The e2e set in two parts whose union is all of it (CI runs them apart: .ci/run). The waiting part: the
# emulated-cluster runs and S1's minutes of stable post-drift traffic are wall-clock waits on
# a few processes, not CPU; the rest measure capacity and latency (S2, S3, the demo) and want the cores.
# The prod overlay's emulated-cluster run measures S2 and S3 too, so it runs with the rest (E2E_CAPACITY:
# a test name that -k picks out of E2E_WAITING's files).
E2E_WAITING := tests/harness tests/e2e/test_s1_drift.py tests/e2e/test_s1_up.py
E2E_CAPACITY := test_prod_overlay_with_network_policies_enforced_runs_s1_to_s4
test-e2e-waiting: setup-test
	@$(call PYTEST_RUN,-m e2e $(E2E_WAITING) -k "not $(E2E_CAPACITY)")

test-e2e-rest: setup-test
	@$(call PYTEST_RUN,-m e2e tests $(addprefix --deselect=,$(filter-out tests/harness,$(E2E_WAITING))) \
	  -k "$(E2E_CAPACITY) or not test_emulated_cluster")

test-all: test test-e2e

test-fast: setup-test
	@$(call PYTEST_RUN,-m "not slow and not e2e")

# The benchmarks with a target run with --check (exit 1 when it is missed: benchmarks/verdict.py); the
# measurement tools beside them (no target) run too. drift_corruptions, serving_peers and verdict are modules.
BENCH_CHECKED := agent_events alarms canary delivery_analysis drift s1 scaling serving tuning tuning_sweep
BENCH_TOOLS := tracking serving_cpu s1_corruptions
bench: setup-test bench-peers
	for b in $(BENCH_CHECKED); do $(BIN)/python benchmarks/$$b.py --quick --check || exit 1; done
	for b in $(BENCH_TOOLS); do $(BIN)/python benchmarks/$$b.py --quick || exit 1; done

lint: setup-test
	$(BIN)/ruff check scanflow workflows tests benchmarks
	$(BIN)/mypy scanflow workflows

clean:
	rm -rf $(VENV) .scanflow
