"""The provider port: one model call, in and out. Adapters raise the typed errors of engine.errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from engine.core.attachments import Attachment
from engine.core.errors import (
    JobError,
    ProviderRateLimitedError,
    ProviderRejectedError,
    ProviderTimeoutError,
    ProviderUnavailableError,
)


@dataclass(frozen=True, slots=True)
class ChatTurn:
    role: Literal["assistant", "user"]
    content: str


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str
    system: str
    user: str
    # The job type's name: the structured output's name, and the identity adapters send along.
    schema_name: str
    # The JSON schema of the answer to this job's input (JobDefinition.output_schema).
    output_schema: dict[str, Any]
    max_tokens: int
    timeout_seconds: float
    # Turns after the user prompt: a rejected answer and the re-ask that explains why.
    conversation: tuple[ChatTurn, ...] = ()
    # Names the prompt prefix this request shares with others (the job type and its prompt version),
    # for providers whose prompt cache takes a hint (OpenAI's prompt_cache_key).
    cache_key: str | None = None
    # The documents and images the user turn carries after its text (docs/attachments.md).
    attachments: tuple[Attachment, ...] = ()
    # The provider's service tier to ask for: FLEX_TIER, or None for its standard one (docs/cost.md).
    service_tier: str | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """One answer. `input_tokens` include the cached and cache-write ones, `output_tokens` the
    reasoning ones (the OpenTelemetry GenAI conventions); adapters convert their provider's counts."""

    content: str
    model: str
    input_tokens: int
    output_tokens: int
    latency_ms: int
    # Why the model stopped ("stop", "length", ...); explains an empty or cut-off answer.
    finish_reason: str = ""
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    reasoning_tokens: int = 0
    # The service tier the provider says served the call ("flex", "default", ...); None when it says none.
    service_tier: str | None = None


class ModelProvider(Protocol):
    name: str

    def complete(self, request: CompletionRequest) -> Completion:
        """Call the model once; raise a RetryableError or PermanentError subclass on failure."""
        ...


# The service tier a request names to be served at the provider's flex tier: OpenAI's `service_tier`
# value, and Bedrock's `serviceTier.type`.
FLEX_TIER = "flex"

# No call uses more tokens than this; a larger count is a broken envelope, not usage to record.
MAX_TOKEN_COUNT = 100_000_000


def token_count(value: object) -> int:
    """A token count from a provider's usage; ValueError when it is not an integer in [0, MAX_TOKEN_COUNT]."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        raise ValueError("a token count is not an integer between 0 and 100,000,000")
    return value


def part_count(value: object, whole: int) -> int:
    """A count of some of `whole`'s tokens (cached, reasoning); ValueError when it is not within [0, whole]."""
    count = token_count(value)
    if count > whole:
        raise ValueError("a token count's part is larger than the count")
    return count


def error_for_status(
    status: int | None, source: str, detail: str, retry_after_seconds: float | None = None
) -> JobError:
    """The engine error for an HTTP status a provider answered with (docs/errors.md)."""
    if status == 429:
        return ProviderRateLimitedError(f"{source} rate limit ({detail})", retry_after_seconds=retry_after_seconds)
    if status == 408:
        return ProviderTimeoutError(f"{source} timed out ({detail})")
    # Any other 4xx but 409 (a conflict on the provider's side) says the request itself is wrong.
    if status is not None and 400 <= status < 500 and status != 409:
        return ProviderRejectedError(f"{source} rejected the request ({detail})", status_code=status)
    return ProviderUnavailableError(f"{source} unavailable ({detail})")
