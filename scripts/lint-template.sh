#!/usr/bin/env bash
# Lint template.yaml three ways; every one must be clean (any finding fails).
#   1. sam validate --lint     SAM's own validation + cfn-lint (from the .venv-sam venv)
#   2. cfn-lint                CloudFormation rules (from the project venv)
#   3. cfn-lint + serverless   awslabs serverless-rules (cfn-lint-serverless)
# Needs .venv (project venv, with cfn-lint and cfn-lint-serverless) and .venv-sam
# (python3 -m venv .venv-sam && .venv-sam/bin/pip install aws-sam-cli), kept apart so that
# SAM CLI's pins do not clash with the project's.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

for tool in .venv-sam/bin/sam .venv/bin/cfn-lint; do
  if [[ ! -x "$tool" ]]; then
    echo "lint-template: $tool not found; create the venv first (see this script's header)" >&2
    exit 2
  fi
done

echo "== sam validate --lint"
SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1 .venv-sam/bin/sam validate --lint

echo "== cfn-lint"
.venv/bin/cfn-lint template.yaml

echo "== cfn-lint + serverless rules"
.venv/bin/cfn-lint template.yaml --append-rules cfn_lint_serverless.rules

echo "template.yaml: clean"
