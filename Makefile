# The front door. Every target bootstraps what it needs on first use:
#   .venv      the project and its dev tools, from pyproject.toml
#   .venv-sam  AWS SAM CLI, kept apart so that its pins do not clash with the project's
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SAM_VENV := .venv-sam
SAM := $(SAM_VENV)/bin/sam
RUNTIME_VENV := .venv-runtime
RUNTIME_STAMP := $(RUNTIME_VENV)/.installed
# sam build packages for the Lambda runtime (python3.13); pyenv puts it on the path when present.
SAM_PYENV ?= 3.11.7:3.13.0
# The LiteLLM proxy, a provider no one here wrote, for the end-to-end test of `aijobs dev` (its own
# venv, as users run it: a server of its own, whose pins never meet the project's).
LITELLM_VENV := .venv-litellm
LITELLM := $(LITELLM_VENV)/bin/litellm
LITELLM_VERSION := 1.108.7

.PHONY: demo bench test lint lint-template build clean runtime-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(SAM):
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install --quiet --upgrade pip
	$(SAM_VENV)/bin/pip install --quiet 'aws-sam-cli>=1.170'

demo: $(STAMP)
	$(BIN)/aijobs demo

# The engine's figures (docs/performance.md), side by side: about 40 minutes on 2 cores. `make test`
# runs every figure at small sizes (tests/e2e/test_bench.py); `make bench BENCH_ARGS=--quick` does alone.
bench: $(STAMP) $(RUNTIME_STAMP)
	$(BIN)/python -m bench.figures $(BENCH_ARGS)

# A venv holding only the functions' runtime dependencies (what sam build packages), on the
# Lambda runtime's Python when pyenv has it: where the bench measures the worker's cold start.
$(RUNTIME_STAMP): src/requirements.txt
	rm -rf $(RUNTIME_VENV)
	PYENV_VERSION=$(SAM_PYENV) python3.13 -m venv $(RUNTIME_VENV) 2>/dev/null || $(PYTHON) -m venv $(RUNTIME_VENV)
	$(RUNTIME_VENV)/bin/pip install --quiet -r src/requirements.txt
	touch $(RUNTIME_STAMP)

runtime-venv: $(RUNTIME_STAMP)

$(LITELLM):
	rm -rf $(LITELLM_VENV)
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install --quiet --upgrade pip
	$(LITELLM_VENV)/bin/pip install --quiet 'litellm[proxy]==$(LITELLM_VERSION)'

# One worker per core; a test file stays on one worker, so its module-wide stacks are built once.
# The LiteLLM test fails rather than skips here: the proxy is part of what `make test` installs, as is
# the runtime venv, where the quick bench (tests/e2e/test_bench.py) measures the worker's cold start.
test: $(STAMP) $(LITELLM) $(RUNTIME_STAMP)
	AIJOBS_LITELLM=$(LITELLM) AIJOBS_REQUIRE_LITELLM=1 $(BIN)/pytest -n auto --dist loadfile

# lint-imports: the layers of docs/architecture.md, as the contracts of pyproject.toml's [tool.importlinter].
lint: $(STAMP)
	$(BIN)/ruff check src aijobs tests bench
	$(BIN)/ruff format --check src aijobs tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# sam validate --lint, cfn-lint and cfn-lint's serverless rules: all must be clean.
lint-template: $(STAMP) $(SAM)
	scripts/lint-template.sh

# sam build (src/Makefile: each function's pins and src/ but engine/testing), then a check that each
# function ships the engine, its handlers, jobtypes and their pins only.
build: $(SAM)
	PYENV_VERSION=$(SAM_PYENV) SAM_CLI_TELEMETRY=0 $(SAM) build
	$(PYTHON) scripts/check_build.py

clean:
	rm -rf $(VENV) $(SAM_VENV) $(RUNTIME_VENV) $(LITELLM_VENV) .aws-sam .pytest_cache .mypy_cache .ruff_cache .import_linter_cache

# The soak (`make test` runs a small one: tests/e2e/test_soak.py): 1000 jobs in both lanes, a fifth of
# them through the provider's batch API, one in five with an injected fault of every class, each message
# delivered 2-3 times, and 50 pipelines, through a moto server, the local provider, each lane's local
# event source mapping, the batcher and the events function on the table's stream (which repeats every
# record), some invocations killed mid-way; prints one table and fails on any broken check (usage
# reconciled with the provider's log, one completion event per job, no pipeline step advanced twice
# included). About 6 minutes on 2 cores; `make soak SOAK_ARGS="--jobs 200"` for a quicker run
# (python -m bench.soak --help for the rest).
.PHONY: soak
soak: $(STAMP)
	$(BIN)/python -m bench.soak $(SOAK_ARGS)
