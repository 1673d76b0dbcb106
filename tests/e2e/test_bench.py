"""`make bench` on a fresh machine: the settings its cold-start figure builds the worker with."""

from __future__ import annotations

import re

import boto3

from aijobs.stack import load_template
from bench.figures import INIT_ENVIRONMENT
from engine.config import load_settings
from engine.wiring import build_worker


def test_the_cold_start_settings_pass_the_deploy_time_checks() -> None:
    # The provider check refuses the default provider (api.openai.com) without a key; the figure's
    # settings give it the template's kind of key, an ARN its AiApiKeySecretArn parameter accepts.
    build_worker(load_settings(INIT_ENVIRONMENT), boto3.Session(region_name="us-east-1"))

    pattern = load_template()["Parameters"]["AiApiKeySecretArn"]["AllowedPattern"]
    assert re.fullmatch(pattern, INIT_ENVIRONMENT["AI_API_KEY_SECRET_ARN"])
