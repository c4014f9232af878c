# agentauth developer tasks. `make help` lists them.
VENV ?= .venv
PY := $(VENV)/bin/python
PG_TEST_URL ?= postgresql://postgres@127.0.0.1:5432/test
FUZZ_EXAMPLES ?= 1000

.DEFAULT_GOAL := help
LOCK := requirements
#: the environments of noxfile.py, each locked from requirements/<name>.in
NOX_ENVS := mcp2 frameworks
.PHONY: help install lock run test test-pg fuzz lint format types imports check bench screenshots clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-11s %s\n", $$1, $$2}' \
		| sed 's|$$(PG_TEST_URL)|$(PG_TEST_URL)|; s|$$(FUZZ_EXAMPLES)|$(FUZZ_EXAMPLES)|'

$(PY):
	python3 -m venv $(VENV)

install: $(PY) ## install the service with test and lint tools into .venv, from the lock
	$(PY) -m pip install -q --require-hashes -r $(LOCK)/dev.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .

# One resolution (dev, the widest) for every lock; run and test are cut from it, so the three
# never disagree on a version. --universal: the same lock serves every platform and Python 3.11+.
# Without UPGRADE, versions already locked stay unless setup.cfg no longer allows them.
UV_COMPILE = $(VENV)/bin/uv pip compile -q --generate-hashes --universal --python-version 3.11 \
	setup.cfg $(LOCK)/build.in
lock: install ## re-lock after a change to setup.cfg; UPGRADE=1: everything to its newest allowed
	$(UV_COMPILE) --extra dev $(if $(UPGRADE),--upgrade) -o $(LOCK)/dev.txt
	$(UV_COMPILE) --extra test -c $(LOCK)/dev.txt -o $(LOCK)/test.txt
	$(UV_COMPILE) -c $(LOCK)/dev.txt -o $(LOCK)/run.txt
	@# each environment of noxfile.py: the test lock with requirements/ENV.in's pins added, or in
	@# place of its own (ENV.in is read as requirements and as overrides); every other version
	@# as in dev.txt
	for env in $(NOX_ENVS); do \
		names=$$(grep -Eo '^[A-Za-z0-9_.-]+' $(LOCK)/$$env.in | paste -sd'|'); \
		grep -E '^[A-Za-z0-9_.-]+==' $(LOCK)/dev.txt | sed 's/ \\$$//' \
			| grep -Ev "^($$names)==" > $(LOCK)/.dev-pins.txt; \
		$(UV_COMPILE) $(LOCK)/$$env.in --extra test --override $(LOCK)/$$env.in \
			-c $(LOCK)/.dev-pins.txt -o $(LOCK)/$$env.txt || exit 1; \
	done
	rm -f $(LOCK)/.dev-pins.txt

run: install ## serve on http://127.0.0.1:8080 with SQLite (agentauth.db)
	$(VENV)/bin/agentauth serve

test: install ## run the tests on SQLite
	$(PY) -m pytest -q

test-pg: install ## run the tests on the PostgreSQL at $(PG_TEST_URL)
	AGENTAUTH_TEST_DATABASE_URL=$(PG_TEST_URL) $(PY) -m pytest -q

fuzz: install ## schemathesis, long: $(FUZZ_EXAMPLES) requests per operation, a random seed
	@seed=$${AGENTAUTH_FUZZ_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; \
	echo "fuzzing with AGENTAUTH_FUZZ_SEED=$$seed AGENTAUTH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES)"; \
	AGENTAUTH_FUZZ_SEED=$$seed AGENTAUTH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q tests/fuzz

lint: install ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install ## apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

types: install ## mypy, strict
	$(VENV)/bin/mypy api core controller schemas agentauth

imports: install ## the import-layer rules (api/controller -> core -> schemas; SDK alone)
	$(VENV)/bin/lint-imports

check: lint types imports test ## everything CI checks, on SQLite

bench: install ## the benchmarks under bench/ (figures go in bench/RESULTS.md)
	$(PY) -m bench

screenshots: install ## redraw docs/screenshots from the dashboard's browser tests (needs chromium)
	AGENTAUTH_SCREENSHOTS=docs/screenshots $(PY) -m pytest -q tests/dashboard

clean: ## remove caches and the local database
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis agentauth.db agentauth.db-* demo.db demo.db-*
