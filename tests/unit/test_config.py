"""config.load_settings: the environment parsed once, or one line naming the variable."""

from __future__ import annotations

import os
from decimal import Decimal

import pytest

from engine.config import REQUIRED_SETTINGS, LimitSetting, PriceSetting, load_settings
from engine.core.errors import ConfigurationError, MissingSettingsError
from engine.gateway import ModelPrice, price_table


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("JOBS_", "AI_", "AIJOBS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("JOBS_TABLE_NAME", "aijobs-jobs")
    monkeypatch.setenv("JOBS_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/aijobs-jobs")
    monkeypatch.setenv("JOBS_PAYLOAD_BUCKET", "aijobs-payloads")


def configuration_error() -> str:
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_defaults_need_only_the_table_the_queue_and_the_bucket() -> None:
    settings = load_settings()

    assert settings.jobs_table_name == "aijobs-jobs"
    assert settings.jobs_payload_bucket == "aijobs-payloads"
    assert settings.aws_endpoint_url is None
    assert settings.tracing_enabled is False
    assert settings.ai_provider == "openai"
    assert settings.ai_base_url == "https://api.openai.com/v1"
    assert settings.ai_api_key is None
    assert settings.ai_model_primary == "gpt-4o-mini"
    assert settings.ai_model_fallback is None
    assert settings.aijobs_prices == {}
    assert settings.aijobs_job_modules == ()
    assert settings.aijobs_retention_days == 90
    assert settings.ai_structured_output == "json_schema"
    assert settings.aijobs_repair_attempts == 1


def test_a_missing_table_name_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBS_TABLE_NAME")

    assert configuration_error().startswith("JOBS_TABLE_NAME")


def test_a_missing_queue_url_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBS_QUEUE_URL")

    assert configuration_error().startswith("JOBS_QUEUE_URL")


def test_absent_required_settings_are_all_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBS_TABLE_NAME")
    monkeypatch.delenv("JOBS_PAYLOAD_BUCKET")
    monkeypatch.setenv("AIJOBS_RETENTION_DAYS", "0")

    with pytest.raises(MissingSettingsError) as caught:
        load_settings()

    assert str(caught.value) == "JOBS_TABLE_NAME: Field required"
    assert caught.value.variables == ("JOBS_TABLE_NAME", "JOBS_PAYLOAD_BUCKET")
    assert REQUIRED_SETTINGS == ("JOBS_TABLE_NAME", "JOBS_QUEUE_URL", "JOBS_PAYLOAD_BUCKET")


def test_overrides_replace_the_environment_only_for_the_names_they_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIJOBS_RETENTION_DAYS", "7")
    monkeypatch.setenv("aijobs_repair_attempts", "3")

    settings = load_settings(overrides={"JOBS_TABLE_NAME": "stack-jobs", "aijobs_retention_days": "30"})

    assert settings.jobs_table_name == "stack-jobs"
    assert settings.aijobs_retention_days == 30
    assert settings.jobs_payload_bucket == "aijobs-payloads"
    assert settings.aijobs_repair_attempts == 3


@pytest.mark.parametrize("value", [None, "", "Not_A_Bucket", "s3://aijobs-payloads"])
def test_a_missing_or_malformed_payload_bucket_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("JOBS_PAYLOAD_BUCKET")
    else:
        monkeypatch.setenv("JOBS_PAYLOAD_BUCKET", value)

    assert configuration_error().startswith("JOBS_PAYLOAD_BUCKET")


@pytest.mark.parametrize(
    "url",
    ["http://api.example.com/v1", "http://10.0.0.5:8000/v1", "http://llm.internal/v1", "http://127.0.0.1.nip.io/v1"],
)
def test_plain_http_to_a_remote_provider_is_refused(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    # The key travels in a header: in clear over plain http.
    monkeypatch.setenv("AI_BASE_URL", url)

    message = configuration_error()

    assert message.startswith("AI_BASE_URL")
    assert "https" in message


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8700/v1",
        "http://localhost:11434/v1",
        "http://[::1]:8000/v1",
        "http://host.docker.internal:8700/v1",
        "https://api.example.com/v1",
    ],
)
def test_https_or_plain_http_to_this_machine_is_accepted(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("AI_BASE_URL", url)

    assert load_settings().ai_base_url == url


@pytest.mark.parametrize("value", ["ninety", "0", "3651", "1.5", ""])
def test_a_malformed_retention_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AIJOBS_RETENTION_DAYS", value)

    assert configuration_error().startswith("AIJOBS_RETENTION_DAYS: ")


def test_retention_days_is_read_as_an_integer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIJOBS_RETENTION_DAYS", "30")

    assert load_settings().aijobs_retention_days == 30


@pytest.mark.parametrize(
    ("value", "modules"),
    [
        ("myapp.jobs", ("myapp.jobs",)),
        ("myapp.jobs,other.jobs", ("myapp.jobs", "other.jobs")),
        (" myapp.jobs , other.jobs ,", ("myapp.jobs", "other.jobs")),
        ("", ()),
        (",,", ()),
    ],
)
def test_job_modules_are_split_on_commas(monkeypatch: pytest.MonkeyPatch, value: str, modules: tuple[str, ...]) -> None:
    monkeypatch.setenv("AIJOBS_JOB_MODULES", value)

    assert load_settings().aijobs_job_modules == modules


@pytest.mark.parametrize("name", ["AI_MODEL_FALLBACK", "AWS_ENDPOINT_URL", "AI_API_KEY", "AI_API_KEY_SECRET_ARN"])
def test_an_empty_optional_variable_means_unset(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "")

    assert getattr(load_settings(), name.lower()) is None


def test_the_model_tiers_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AI_MODEL_PRIMARY", "deepseek-chat")
    monkeypatch.setenv("AI_MODEL_FALLBACK", "gpt-4o")

    settings = load_settings()

    assert (settings.ai_model_primary, settings.ai_model_fallback) == ("deepseek-chat", "gpt-4o")


def test_the_api_key_is_kept_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AI_API_KEY", "sk-very-secret")

    settings = load_settings()

    assert settings.ai_api_key is not None
    assert settings.ai_api_key.get_secret_value() == "sk-very-secret"
    assert "sk-very-secret" not in repr(settings)


def test_prices_are_read_from_json_as_decimals_with_cache_prices_defaulting_to_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "AIJOBS_PRICES",
        '{"my-model": {"input": 0.15, "output": "0.6", "cached_input": 0.075}, "other": {"input": 1, "output": 2}}',
    )

    prices = load_settings().aijobs_prices

    assert prices["my-model"] == PriceSetting(
        input=Decimal("0.15"), output=Decimal("0.6"), cached_input=Decimal("0.075"), cache_write=None
    )
    assert price_table(load_settings()).price("other") == ModelPrice(
        input=Decimal(1), output=Decimal(2), cached_input=Decimal(1), cache_write=Decimal(1)
    )


@pytest.mark.parametrize(
    "value",
    [
        '{"my-model": [1, 2]}',
        '{"my-model": {"input": 1}}',
        '{"my-model": {"input": "a", "output": 1}}',
        '{"my-model": {"input": -1, "output": 1}}',
        '{"my-model": {"input": "NaN", "output": 1}}',
        '{"my-model": {"input": 1e300, "output": 1}}',
        '{"my-model": {"input": 1, "output": 1, "cache_read": 1}}',
        '{"my-model": {"input": 1, "output": 1, "flex": 0}}',
        '{"my-model": {"input": 1, "output": 1, "flex": 1.5}}',
        '{"my-model": {"input": 1, "output": 1, "flex": "half"}}',
        '{"": {"input": 1, "output": 1}}',
        '["my-model"]',
    ],
)
def test_prices_of_the_wrong_shape_name_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AIJOBS_PRICES", value)

    assert configuration_error().startswith("AIJOBS_PRICES: ")


def test_a_price_out_of_its_range_is_named_by_its_model_and_field(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a flex share past 1 for one model of several
    monkeypatch.setenv(
        "AIJOBS_PRICES", '{"my-model": {"input": 1, "output": 1}, "gpt-4o-mini": {"input": 1, "output": 1, "flex": 2}}'
    )

    # Then the one line names the variable, the model and the field at fault
    assert configuration_error() == "AIJOBS_PRICES: gpt-4o-mini.flex: Input should be less than or equal to 1"


def test_prices_that_are_not_json_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIJOBS_PRICES", "gpt-4o=1,2")

    assert configuration_error().startswith("AIJOBS_PRICES")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AI_PROVIDER", "azure"),
        ("AI_BASE_URL", "llm.local"),
        ("JOBS_QUEUE_URL", "aijobs-jobs"),
        ("AI_API_KEY_SECRET_ARN", "my-secret"),
        ("AI_MODEL_PRIMARY", ""),
        ("JOBS_TABLE_NAME", "ab"),
        ("AIJOBS_DEFAULT_LEASE_SECONDS", "5"),
    ],
)
def test_a_malformed_setting_names_its_variable(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)

    assert configuration_error().startswith(f"{name}: ")


@pytest.mark.parametrize("value", ["json_schema", "json_object"])
def test_the_structured_output_mode_is_read(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AI_STRUCTURED_OUTPUT", value)

    assert load_settings().ai_structured_output == value


@pytest.mark.parametrize("value", ["json", "text", "JSON_OBJECT", "json-schema", ""])
def test_an_unknown_structured_output_mode_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AI_STRUCTURED_OUTPUT", value)

    message = configuration_error()

    assert message.startswith("AI_STRUCTURED_OUTPUT: ")
    assert "'json_schema'" in message
    assert "'json_object'" in message


@pytest.mark.parametrize("value", ["0", "1", "2", "3"])
def test_repair_attempts_are_read_from_zero_to_three(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AIJOBS_REPAIR_ATTEMPTS", value)

    assert load_settings().aijobs_repair_attempts == int(value)


@pytest.mark.parametrize("value", ["-1", "4", "10", "one", "1.5", ""])
def test_repair_attempts_out_of_bounds_name_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AIJOBS_REPAIR_ATTEMPTS", value)

    assert configuration_error().startswith("AIJOBS_REPAIR_ATTEMPTS: ")


def test_variable_names_are_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ai_model_primary", "gpt-4.1")

    assert load_settings().ai_model_primary == "gpt-4.1"


# --- shared limits and budgets ------------------------------------------------------------------


def test_provider_limits_are_read_per_model_and_empty_turns_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIJOBS_PROVIDER_LIMITS",
        '{"gpt-4o-mini": {"rpm": 500, "tpm": 200000}, "anthropic.claude-3-5-haiku": {"rpm": 50}}',
    )
    limits = load_settings().aijobs_provider_limits
    assert limits["gpt-4o-mini"] == LimitSetting(rpm=500, tpm=200_000)
    assert limits["anthropic.claude-3-5-haiku"] == LimitSetting(rpm=50)

    monkeypatch.setenv("AIJOBS_PROVIDER_LIMITS", "")
    assert load_settings().aijobs_provider_limits == {}


@pytest.mark.parametrize(
    "value",
    [
        '{"m": {}}',
        '{"m": {"rpm": 0}}',
        '{"m": {"rpm": 1.5}}',
        '{"m": {"rpm": "500"}}',
        '{"m": {"rpm": true}}',
        '{"m": {"rpm": 500, "rps": 1}}',
        '{"m": {"tpm": 1e30}}',
        '{"m": {"rpm": 10, "shards": 0}}',
        '{"m": 500}',
        "[1]",
        "{",
    ],
)
def test_provider_limits_of_the_wrong_shape_name_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AIJOBS_PROVIDER_LIMITS", value)

    assert configuration_error().startswith("AIJOBS_PROVIDER_LIMITS")


@pytest.mark.parametrize(
    ("value", "enabled", "default"),
    [("", False, None), ("5", True, Decimal(5)), ("0.25", True, Decimal("0.25")), ("unlimited", True, None)],
)
def test_the_default_daily_budget_turns_budgets_on_with_or_without_a_default_cap(
    monkeypatch: pytest.MonkeyPatch, value: str, enabled: bool, default: Decimal | None
) -> None:
    monkeypatch.setenv("AIJOBS_DEFAULT_DAILY_BUDGET_USD", value)

    settings = load_settings()

    assert (settings.budgets_enabled, settings.default_daily_budget_usd) == (enabled, default)


@pytest.mark.parametrize("value", ["-1", "NaN", "Infinity", "5 USD", "none", "1e12"])
def test_a_default_daily_budget_that_is_not_an_amount_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("AIJOBS_DEFAULT_DAILY_BUDGET_USD", value)

    assert configuration_error().startswith("AIJOBS_DEFAULT_DAILY_BUDGET_USD")
