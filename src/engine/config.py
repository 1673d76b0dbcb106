"""Settings, parsed once from the environment: the only code of the engine that reads it.

Each Lambda handler calls `load_settings()` once, on its first invocation, and builds its parts
from the result (engine.wiring); tests and the embedded stack build Settings themselves and pass
them in. docs/configuration.md lists the variables.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from engine.core.errors import ConfigurationError, MissingSettingsError

HttpUrl = Annotated[str, Field(pattern=r"^https?://\S+$")]
BucketName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")]
AttachmentLimitName = Literal[
    "max_file_bytes",
    "max_image_bytes",
    "max_total_bytes",
    "max_images",
    "max_documents",
    "max_pdf_pages",
    "max_pixels_per_side",
    "many_images",
    "many_images_pixels_per_side",
]
ModelId = Annotated[str, Field(min_length=1, max_length=256)]
# US dollars per million tokens: no price list comes near 10,000.
UsdPerMillion = Annotated[Decimal, Field(ge=0, le=10_000, allow_inf_nan=False)]
# A discount's price as a share of the list price.
Share = Annotated[Decimal, Field(gt=0, le=1, allow_inf_nan=False)]


# The API each provider kind calls when AI_BASE_URL is not set.
DEFAULT_BASE_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}


class LimitSetting(BaseModel):
    """One model's shared limit in AIJOBS_PROVIDER_LIMITS: requests and/or tokens per minute."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rpm: Annotated[int, Field(ge=1, le=100_000_000, strict=True)] | None = None
    tpm: Annotated[int, Field(ge=1, le=10_000_000_000, strict=True)] | None = None
    # Buckets the limit is split over (default: one per 30,000 requests a minute).
    shards: Annotated[int, Field(ge=1, le=64, strict=True)] | None = None

    @model_validator(mode="after")
    def _some_limit(self) -> LimitSetting:
        if self.rpm is None and self.tpm is None:
            raise ValueError("a model's limit needs rpm, tpm or both")
        return self


class PriceSetting(BaseModel):
    """One model's prices in AIJOBS_PRICES; cached and cache-write input default to the input price."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: UsdPerMillion
    output: UsdPerMillion
    cached_input: UsdPerMillion | None = None
    cache_write: UsdPerMillion | None = None
    # What a call through the provider's batch API costs, as a share of these (OpenAI, Anthropic and
    # Bedrock sell batches at half price).
    batch: Share | None = None
    # What a call at the provider's flex tier costs, as a share of these (OpenAI's is the batch price);
    # given, it also says the model has a flex tier (docs/cost.md).
    flex: Share | None = None


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    jobs_table_name: Annotated[str, Field(min_length=3, max_length=255)]
    # The interactive lane's queue, and the background lane's (docs/lanes.md; unset: background jobs
    # share the interactive queue, and its pollers).
    jobs_queue_url: HttpUrl
    jobs_background_queue_url: HttpUrl | None = None
    # Inputs and dead-letter bodies too large for a DynamoDB item are kept here (S3).
    jobs_payload_bucket: BucketName
    # boto3's own override: one local endpoint for every AWS service (the embedded stack).
    aws_endpoint_url: HttpUrl | None = None
    # The dead-letter queue, read by the client only: its depth, on the dashboard's health strip.
    jobs_dlq_url: HttpUrl | None = None

    ai_provider: Literal["openai", "bedrock", "anthropic"] = "openai"
    # Unset: the provider's own API (DEFAULT_BASE_URLS).
    ai_base_url: HttpUrl = "https://api.openai.com/v1"
    ai_api_key: SecretStr | None = None
    ai_api_key_secret_arn: Annotated[str | None, Field(pattern=r"^arn:aws[a-z-]*:secretsmanager:\S+$")] = None
    ai_model_primary: Annotated[str, Field(min_length=1)] = "gpt-4o-mini"
    ai_model_fallback: str | None = None
    # json_schema (strict structured output) or json_object, for providers without json_schema.
    ai_structured_output: Literal["json_schema", "json_object"] = "json_schema"
    # Anthropic models (ids, or ids without their date) given the JSON-schema output format; every other
    # model answers through one forced tool (docs/gateway.md).
    ai_json_output_models: tuple[ModelId, ...] = ()
    # Re-asks with the validation error, within one attempt, before an answer fails the job.
    aijobs_repair_attempts: Annotated[int, Field(ge=0, le=3)] = 1

    # Price overrides, JSON: {"model-id": {"input": 0.15, "cached_input": 0.075, "cache_write": 0.15, "output": 0.6}}.
    aijobs_prices: dict[ModelId, PriceSetting] = Field(default_factory=dict)
    # Shared rate limits per model id, JSON: {"gpt-4o-mini": {"rpm": 500, "tpm": 200000}}; empty: none.
    aijobs_provider_limits: dict[ModelId, LimitSetting] = Field(default_factory=dict)
    # Daily spending cap per user (UTC days) for users without their own; "unlimited" or empty: only
    # users with a cap of their own (`aijobs budget set`) are capped. Set (either way), every model
    # must have a price.
    aijobs_default_daily_budget_usd: (
        Annotated[Decimal, Field(ge=0, le=1_000_000_000, allow_inf_nan=False)] | Literal["unlimited"] | None
    ) = None
    # The part of a user's daily cap, in percent, that background jobs may not reserve: what is left
    # for the user's interactive jobs when a backfill has spent the rest.
    aijobs_background_budget_reserve_percent: Annotated[Decimal, Field(ge=0, le=100, allow_inf_nan=False)] = Decimal(10)
    aijobs_job_modules: tuple[str, ...] = ()
    # Background jobs through the provider's batch API (docs/batches.md): "on" or "off". A background
    # job whose deadline is at least rescue + window + poll + 60 s away joins a batch; the batch
    # gathers jobs for the window, is checked every poll seconds, and a job still unanswered rescue
    # seconds before its deadline is taken back to real time.
    aijobs_batch_api: bool = False
    aijobs_batch_window_seconds: Annotated[int, Field(ge=1, le=86_400)] = 300
    aijobs_batch_poll_seconds: Annotated[int, Field(ge=1, le=3_600)] = 60
    aijobs_batch_rescue_seconds: Annotated[int, Field(ge=1, le=86_400)] = 1_800
    # The service role Bedrock's batch inference jobs read their input and write their output with.
    aijobs_batch_role_arn: Annotated[str | None, Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/\S+$")] = None
    # Background jobs that do not go in a batch are called at the provider's flex tier, where the model
    # has one (docs/cost.md): "on" or "off".
    aijobs_flex: bool = False
    # Buckets attachments may name besides the payload bucket (the worker's role reads only these), and
    # the providers' per-request limits on them, over their documented defaults (docs/attachments.md).
    aijobs_attachment_buckets: tuple[BucketName, ...] = ()
    aijobs_attachment_limits: dict[AttachmentLimitName, Annotated[int, Field(ge=1, le=10**12, strict=True)]] = Field(
        default_factory=dict
    )
    # The EventBridge bus completion events go to (a name or an ARN; "default": the account's own).
    aijobs_event_bus: Annotated[str, Field(min_length=1, max_length=1600, pattern=r"^[A-Za-z0-9._\-/:]+$")] = "default"
    # Kept after a job ends before DynamoDB's TTL removes its items.
    aijobs_retention_days: Annotated[int, Field(ge=1, le=3650)] = 90
    # The jobs queue's maxReceiveCount (the template's MaxReceiveCount): a waiting job's message is
    # hidden so that the receives it has left reach its deadline (engine.retry.reach_floor_seconds).
    aijobs_max_receive_count: Annotated[int, Field(ge=2, le=1000)] = 100
    # The lease when the worker runs outside Lambda with no context to read a deadline from.
    aijobs_default_lease_seconds: Annotated[int, Field(ge=10, le=900)] = 300
    # How long a worker serves the data job types' labels it read before it reads them again: the most
    # a promote or a rollback takes to reach it (docs/jobtypes.md: 60 at most).
    aijobs_job_types_refresh_seconds: Annotated[int, Field(ge=1, le=60)] = 60

    # X-Ray tracing: on in Lambda (LAMBDA_TASK_ROOT is set), unless POWERTOOLS_TRACE_DISABLED.
    lambda_task_root: str | None = None
    powertools_trace_disabled: bool = False

    @property
    def budgets_enabled(self) -> bool:
        """Budgets declared for the deployment (a default cap, or "unlimited"). Caps of users' own hold
        either way; this makes a model without a price a configuration error."""
        return self.aijobs_default_daily_budget_usd is not None

    @property
    def default_daily_budget_usd(self) -> Decimal | None:
        """The cap of users without their own; None: none (no budgets, or "unlimited")."""
        budget = self.aijobs_default_daily_budget_usd
        return budget if isinstance(budget, Decimal) else None

    @property
    def local_endpoint(self) -> bool:
        """Whether AWS is this machine (the embedded stack): AWS_ENDPOINT_URL names a local host."""
        return self.aws_endpoint_url is not None and is_local_host(urlsplit(self.aws_endpoint_url).hostname or "")

    @property
    def tracing_enabled(self) -> bool:
        return bool(self.lambda_task_root) and not self.powertools_trace_disabled

    @model_validator(mode="before")
    @classmethod
    def _provider_base_url(cls, values: Any) -> Any:
        # With no AI_BASE_URL (or an empty one: CloudFormation cannot omit it), the provider's own API.
        if isinstance(values, dict) and not values.get("ai_base_url"):
            provider = values.get("ai_provider")
            base = DEFAULT_BASE_URLS.get(provider if isinstance(provider, str) else "openai")
            values = {**values, "ai_base_url": base} if base else values
        return values

    @field_validator(
        "aws_endpoint_url",
        "jobs_background_queue_url",
        "jobs_dlq_url",
        "ai_api_key_secret_arn",
        "ai_model_fallback",
        "ai_api_key",
        "lambda_task_root",
        "aijobs_default_daily_budget_usd",
        "aijobs_batch_role_arn",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # CloudFormation cannot omit a variable, so an empty string means "not configured".
        return None if value == "" else value

    @field_validator("ai_base_url")
    @classmethod
    def _tls_unless_local(cls, value: str) -> str:
        # The API key travels in a header: plain http only to this machine (a local model, sam local).
        parts = urlsplit(value)
        if parts.scheme == "http" and not is_local_host(parts.hostname or ""):
            raise ValueError(f"plain http sends the API key in clear; use https for {parts.hostname or 'that host'}")
        return value

    @field_validator("aijobs_prices", "aijobs_provider_limits", "aijobs_attachment_limits", mode="before")
    @classmethod
    def _parse_json(cls, value: object) -> object:
        if isinstance(value, str):
            if not value.strip():
                return {}  # CloudFormation cannot omit a variable: empty means none
            try:
                return json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not valid JSON ({exc})") from exc
        return value

    @field_validator("aijobs_job_modules", "aijobs_attachment_buckets", "ai_json_output_models", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("aijobs_batch_api", "aijobs_flex", mode="before")
    @classmethod
    def _on_or_off(cls, value: object) -> object:
        if isinstance(value, str):
            word = value.strip().lower()
            if word not in {"on", "off", "true", "false", ""}:
                raise ValueError(f"must be on or off, not {value[:20]!r}")
            return word in {"on", "true"}
        return value

    @field_validator("powertools_trace_disabled", mode="before")
    @classmethod
    def _flag(cls, value: object) -> object:
        return value.strip().lower() in {"1", "true", "yes", "on"} if isinstance(value, str) else value


def is_local_host(host: str) -> bool:
    """Whether `host` is this machine: where plain http, and an endpoint without a key, are fine."""
    if host == "localhost" or host.endswith(".localhost") or host == "host.docker.internal":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# The variables without a default: the ones that name the stack's table, queue and bucket.
REQUIRED_SETTINGS = tuple(name.upper() for name, field in Settings.model_fields.items() if field.is_required())


def load_settings(environ: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None) -> Settings:
    """Parse the environment (names in any case), or fail with one line naming the variable.

    `overrides` (a deployed stack's outputs, say) replace the environment's values of the names they hold.
    """
    fields = Settings.model_fields
    source = os.environ if environ is None else environ
    values: dict[str, Any] = {name.lower(): value for name, value in source.items() if name.lower() in fields}
    values.update({name.lower(): value for name, value in (overrides or {}).items() if name.lower() in fields})
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        variable = str(first["loc"][0]).upper() if first["loc"] else "environment"
        # Within a JSON setting, where: `AIJOBS_PRICES: gpt-4o-mini.flex: Input should be ...`.
        within = ".".join(str(part) for part in first["loc"][1:])
        message = f"{variable}: {within + ': ' if within else ''}{first['msg']}"
        missing = tuple(str(error["loc"][0]).upper() for error in errors if error["type"] == "missing" and error["loc"])
        if missing:
            raise MissingSettingsError(message, missing) from exc
        raise ConfigurationError(message) from exc
