# The front door. Every target bootstraps what it needs on first use:
#   .venv      the project and its dev tools, from pyproject.toml
#   .venv-sam  AWS SAM CLI, kept apart so that its pins do not clash with the project's
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SAM_VENV := .venv-sam
SAM := $(SAM_VENV)/bin/sam
# sam build packages for the Lambda runtime (python3.13); pyenv puts it on the path when present.
SAM_PYENV ?= 3.11.7:3.13.0

.PHONY: demo bench test lint lint-template build clean

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

# The figures of SPEC section 10, side by side (not part of `make test`).
bench: $(STAMP)
	$(BIN)/python -m bench.figures

test: $(STAMP)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check src aijobs tests bench
	$(BIN)/ruff format --check src aijobs tests bench
	$(BIN)/mypy

# sam validate --lint, cfn-lint and cfn-lint's serverless rules: all must be clean.
lint-template: $(STAMP) $(SAM)
	scripts/lint-template.sh

build: $(SAM)
	PYENV_VERSION=$(SAM_PYENV) SAM_CLI_TELEMETRY=0 $(SAM) build

clean:
	rm -rf $(VENV) $(SAM_VENV) .aws-sam .pytest_cache .mypy_cache .ruff_cache

# The soak (not part of `make test`): 1000 jobs, one in five with an injected fault of every class,
# each message delivered 2-3 times, through a moto server, the local provider and the local event
# source mapping; prints one table and fails on any broken check. About 4 minutes on 2 cores;
# `make soak SOAK_ARGS="--jobs 200"` for a quicker run (python -m bench.soak --help for the rest).
.PHONY: soak
soak: $(STAMP)
	$(BIN)/python -m bench.soak $(SOAK_ARGS)
