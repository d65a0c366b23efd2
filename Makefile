# CaseHub — the two commands a new user needs: `make run` and `make test`.
SHELL := /bin/bash
PORT ?= 8000
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test fuzz lint format typecheck scenarios bench eval llm-check venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/find-python
	@if [ -x $(PY) ] && ! $(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)'; then rm -rf $(VENV); fi
	@if [ ! -x $(PY) ]; then python=$$(scripts/find-python) || exit 1; echo "Creating $(VENV) with $$python"; "$$python" -m venv $(VENV); fi
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

## run: gunicorn on 127.0.0.1:$(PORT), a Celery worker and Celery beat on the embedded broker (demo mode)
run: venv
	CASEHUB_DEMO=1 $(PY) manage.py runcasehub 127.0.0.1:$(PORT)

## test: the whole suite against the database and broker the environment names
test: venv
	SECRET_KEY=$${SECRET_KEY:-tests-only-not-a-secret} CASEHUB_VAR_DIR=$${CASEHUB_VAR_DIR:-$(CURDIR)/var/test} \
	  $(VENV)/bin/pytest $(ARGS)

## fuzz: the stateful property test (tests/execution/test_stateful.py) with many random sequences (PostgreSQL)
fuzz: venv
	SECRET_KEY=$${SECRET_KEY:-tests-only-not-a-secret} CASEHUB_VAR_DIR=$${CASEHUB_VAR_DIR:-$(CURDIR)/var/test} \
	  CASEHUB_FAIL_ON_SKIP=1 CASEHUB_FUZZ_EXAMPLES=$${CASEHUB_FUZZ_EXAMPLES:-500} CASEHUB_FUZZ_STEPS=$${CASEHUB_FUZZ_STEPS:-60} \
	  $(VENV)/bin/pytest -p no:cacheprovider tests/execution/test_stateful.py $(ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## typecheck: mypy, strict on planning/core and planning/packs, django-stubs on the apps
typecheck: venv
	SECRET_KEY=typecheck-only CASEHUB_VAR_DIR=$(CURDIR)/var/typecheck $(VENV)/bin/mypy $(ARGS)

## scenarios: which rows of ../shared/RELIABILITY.md the tests automate, and which are missing
scenarios:
	@python=$$([ -x $(PY) ] && echo $(PY) || scripts/find-python) && "$$python" scripts/scenarios.py

## bench: the benchmarks in bench/ (the load run's short form among them; `$(PY) -m bench load --minutes 10` is its long form)
bench: venv
	@if [ ! -f $(VENV)/.installed-bench ] || [ pyproject.toml -nt $(VENV)/.installed-bench ]; then \
	  $(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]' && touch $(VENV)/.installed-bench; fi
	SECRET_KEY=$${SECRET_KEY:-bench-only-not-a-secret} $(PY) -m bench

## eval: plan the evaluation set (eval/goals) with every strategy and score the plans; the fake
## model by default, a real one with OPENAI_BASE_URL and CASEHUB_LLM_MODEL (ARGS="--goals fraud")
eval: venv
	$(PY) -m eval $(ARGS)

## llm-check: plan three cases through `make run` with a real local model (llama.cpp, SmolLM2)
llm-check: venv
	$(PY) scripts/llm_check.py

clean:
	rm -rf var/broker var/celery-results var/test-casehub.sqlite3*
