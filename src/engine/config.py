"""Settings, parsed once from the environment. Nothing else in the engine reads os.environ."""

from __future__ import annotations

import ipaddress
import json
import os
from decimal import Decimal
from functools import lru_cache
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.errors import ConfigurationError


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    jobs_table_name: Annotated[str, Field(min_length=3, max_length=255)]
    jobs_queue_url: Annotated[str, Field(pattern=r"^https?://\S+$")]
    jobs_dlq_url: Annotated[str | None, Field(pattern=r"^https?://\S+$")] = None
    # Inputs and dead-letter bodies too large for a DynamoDB item are kept here (S3).
    jobs_payload_bucket: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")]

    ai_provider: Literal["openai", "bedrock"] = "openai"
    ai_base_url: Annotated[str, Field(pattern=r"^https?://\S+$")] = "https://api.openai.com/v1"
    ai_api_key: SecretStr | None = None
    ai_api_key_secret_arn: Annotated[str | None, Field(pattern=r"^arn:aws[a-z-]*:secretsmanager:\S+$")] = None
    ai_model_primary: Annotated[str, Field(min_length=1)] = "gpt-4o-mini"
    ai_model_fallback: str | None = None
    # json_schema (strict structured output) or json_object, for providers without json_schema.
    ai_structured_output: Literal["json_schema", "json_object"] = "json_schema"
    # Re-asks with the validation error, within one attempt, before an answer fails the job.
    aijobs_repair_attempts: Annotated[int, Field(ge=0, le=3)] = 1

    # Price overrides, JSON: {"model-id": [usd_per_million_input, usd_per_million_output]}.
    aijobs_model_prices: Annotated[dict[str, tuple[Decimal, Decimal]], NoDecode] = Field(default_factory=dict)
    aijobs_job_modules: Annotated[tuple[str, ...], NoDecode] = ()
    # Kept after a job ends before DynamoDB's TTL removes its items.
    aijobs_retention_days: Annotated[int, Field(ge=1, le=3650)] = 90
    # The lease when the worker runs outside Lambda with no context to read a deadline from.
    aijobs_default_lease_seconds: Annotated[int, Field(ge=10, le=900)] = 300

    @field_validator("jobs_dlq_url", "ai_api_key_secret_arn", "ai_model_fallback", "ai_api_key", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # CloudFormation cannot omit a variable, so an empty string means "not configured".
        return None if value == "" else value

    @field_validator("ai_base_url")
    @classmethod
    def _tls_unless_local(cls, value: str) -> str:
        # The API key travels in a header: plain http only to this machine (a local model, sam local).
        parts = urlsplit(value)
        if parts.scheme == "http" and not _is_local_host(parts.hostname or ""):
            raise ValueError(f"plain http sends the API key in clear; use https for {parts.hostname or 'that host'}")
        return value

    @field_validator("aijobs_model_prices", mode="before")
    @classmethod
    def _parse_json(cls, value: object) -> object:
        # Parsed here rather than by pydantic-settings so that bad JSON is a field error naming the variable.
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not valid JSON ({exc})") from exc
        return value

    @field_validator("aijobs_job_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value


def _is_local_host(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost") or host == "host.docker.internal":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tracing_enabled() -> bool:
    """Whether X-Ray tracing is on: in Lambda, unless POWERTOOLS_TRACE_DISABLED says otherwise."""
    disabled = os.environ.get("POWERTOOLS_TRACE_DISABLED", "false").lower() in {"1", "true", "yes", "on"}
    return bool(os.environ.get("LAMBDA_TASK_ROOT")) and not disabled


def read_ai_base_url() -> str | None:
    """AI_BASE_URL when the environment sets it: `aijobs dev` then uses that provider, not its own."""
    return os.environ.get("AI_BASE_URL") or None


def load_settings() -> Settings:
    """Parse the environment, or fail with one line naming the variable."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        variable = str(first["loc"][0]).upper() if first["loc"] else "environment"
        raise ConfigurationError(f"{variable}: {first['msg']}") from exc


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
