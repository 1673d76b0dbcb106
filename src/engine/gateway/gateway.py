"""The gateway the runner calls: render the prompt, call the model, validate, re-ask, fall back, price.

One `execute` is one attempt of a job. Within it the gateway may
- re-ask the model that answered, with the validation error, up to `repair_attempts` times;
- try the fallback model when the primary one is unavailable or times out.
Every call that got an answer counts: its tokens and cost are summed into the attempt. An attempt
whose first call went through a provider's batch (docs/batches.md) starts from that call's answer,
priced at the batch price; its re-asks and fallback are made in real time. An attempt may ask the
provider's flex tier (`CallTier`, docs/cost.md): its calls to a model that has one are made there,
with a longer timeout, priced at the flex price when the provider says flex served them; when flex
is unavailable the attempt ends for the job to wait for it, or, near the job's deadline, goes on at
the standard tier at once. Beside its cost each attempt counts what the same calls would have cost
in real time at the standard tier.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from engine.core import Via
from engine.core.attachments import Attachment
from engine.core.errors import (
    BusinessValidationError,
    FlexUnavailableError,
    InternalError,
    JobError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    ReferenceValidationError,
    SchemaValidationError,
)
from engine.definitions import JobDefinition, RenderedPrompt
from engine.gateway.attachment_tokens import attachment_tokens
from engine.gateway.pricing import Cost, PriceTable
from engine.gateway.provider import FLEX_TIER, ChatTurn, Completion, CompletionRequest, ModelProvider
from engine.observability import genai_usage, log_unexpected, logger, provider_call
from engine.text import bounded, valid_text

# Errors a re-ask with the validation error may mend; and errors a different model may avoid.
_REPAIRABLE = (SchemaValidationError, BusinessValidationError, ReferenceValidationError)
_FALLS_BACK = (ProviderUnavailableError, ProviderTimeoutError)
# Below this much time left, no further call is started within the attempt.
MIN_CALL_SECONDS = 1.0
# A flex call's timeout: OpenAI's advice (its SDKs' 10 minutes raised to 15), since a flex request may
# wait for capacity. Capped, as every call's, by what is left of the invocation.
FLEX_TIMEOUT_SECONDS = 900.0

TimeLeft = Callable[[], float]


class CallTier(StrEnum):
    """The service tier an attempt's calls ask for (engine.decisions.decide_tier, docs/cost.md)."""

    STANDARD = "standard"
    # The provider's flex tier, for a model that has one; when flex is unavailable the attempt ends
    # with FlexUnavailableError (the job waits for it, its attempt refunded).
    FLEX = "flex"
    # The flex tier, and when flex is unavailable the standard tier at once, within the attempt (the
    # job's deadline is near); a flex call then leaves the standard call its timeout.
    FLEX_OR_STANDARD = "flex_or_standard"


@dataclass(frozen=True, slots=True)
class ModelTiers:
    primary: str
    fallback: str | None = None

    def chain(self, tier: str) -> list[tuple[str, str]]:
        """The (tier, model) pairs to try in order for a job type's tier."""
        if tier == "fallback":
            return [("fallback", self.fallback)] if self.fallback else [("primary", self.primary)]
        chain = [("primary", self.primary)]
        if self.fallback and self.fallback != self.primary:
            chain.append(("fallback", self.fallback))
        return chain


@dataclass(frozen=True, slots=True)
class Execution:
    """One attempt's result: the validated output or the error, and what its calls cost."""

    prompt: RenderedPrompt
    provider: str
    tier: str
    model: str
    output: BaseModel | None = None
    error: JobError | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    latency_ms: int = 0
    calls: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    reasoning_tokens: int = 0
    cache_savings_usd: Decimal = Decimal(0)
    # False when a call of the attempt was made to a model with no price (its cost counted as 0).
    priced: bool = True
    # The provider's batch that made the attempt's first call, when one did.
    batch_id: str | None = None
    # Re-asks after an answer failed validation, and, when the attempt ended so, the last answer
    # refused (as it came, made valid Unicode; the store bounds what it keeps).
    reasks: int = 0
    refused_answer: str | None = None
    # How its first call was made; what its calls would have cost in real time at the standard tier;
    # the service tier the provider said served its last answer (None when it said none).
    via: Via = Via.REALTIME
    standard_cost_usd: Decimal = Decimal(0)
    service_tier: str | None = None


@dataclass(frozen=True, slots=True)
class Answered:
    """What a provider's batch answered to an attempt's first call (engine.gateway.batches); `extras`,
    completions the batch gave the same request again, are paid for too and counted as calls."""

    completion: Completion
    batch_id: str
    extras: tuple[Completion, ...] = ()


@dataclass
class _Tally:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    cache_savings_usd: Decimal = Decimal(0)
    latency_ms: int = 0
    calls: int = 0
    priced: bool = True
    tier: str = "primary"
    model: str = ""
    conversation: list[ChatTurn] = field(default_factory=list)
    reasks: int = 0
    refused_answer: str | None = None
    # Whether the current model's calls ask the flex tier, and whether the attempt's first call did.
    flex: bool = False
    first_flex: bool = False
    standard_cost_usd: Decimal = Decimal(0)
    service_tier: str | None = None

    def add(self, completion: Completion, cost: Cost, standard: Cost) -> None:
        """A call's answer, at `cost`; `standard`, the same call's in real time at the standard tier."""
        self.input_tokens += completion.input_tokens
        self.output_tokens += completion.output_tokens
        self.cached_input_tokens += completion.cached_input_tokens
        self.cache_write_input_tokens += completion.cache_write_input_tokens
        self.reasoning_tokens += completion.reasoning_tokens
        self.cost_usd += cost.usd
        self.standard_cost_usd += standard.usd
        self.cache_savings_usd += cost.cache_savings_usd
        self.priced = self.priced and cost.priced
        self.latency_ms += completion.latency_ms
        self.service_tier = completion.service_tier


@dataclass(frozen=True, slots=True)
class CallPlan:
    """What an attempt may use, before it runs: for the shared limits and the budgets."""

    # The model of the attempt's first call, and that call's tokens at most (input + max output).
    model: str
    first_call_tokens: int
    # The most the attempt can cost: every model of its chain, every re-ask, at max tokens.
    worst_case_usd: Decimal
    # Models of its chain with no price: what they would cost is unknown, so no budget can hold it.
    unpriced: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Call:
    """What every call of an attempt asks: the job type, its rendered prompt, the output schema for its
    input, its attachments, and how much of the invocation is left."""

    definition: JobDefinition
    prompt: RenderedPrompt
    output_schema: dict[str, Any]
    attachments: tuple[Attachment, ...] = ()
    time_left: TimeLeft | None = None
    # How long a flex call may still take, by the job's deadline (engine.decisions.flex_seconds_left).
    flex_left: TimeLeft | None = None


# Tokens of a chat message's framing (role, separators) beyond its text, as providers count them.
MESSAGE_OVERHEAD_TOKENS = 8
# What a re-ask says after the rejected answer; its reason is cut to REASK_REASON_CHARS, so that
# a re-ask adds at most the answer (max_tokens) and REASK_TOKENS (4 UTF-8 bytes a character at worst).
REASK = "Your answer was not accepted: {reason}. Answer again with only the corrected JSON object."
REASK_REASON_CHARS = 300
REASK_TOKENS = len(REASK.encode()) + 4 * REASK_REASON_CHARS + MESSAGE_OVERHEAD_TOKENS


def input_token_bound(*texts: str) -> int:
    """More tokens than `texts` can make: no tokenizer makes a token of less than one UTF-8 byte."""
    return sum(len(text.encode("utf-8", "surrogatepass")) + MESSAGE_OVERHEAD_TOKENS for text in texts)


def prompt_cache_key(job_type: str, prompt_version: str) -> str:
    """What requests of a job type share, for a provider's prompt cache: its instructions, of one version."""
    return f"{job_type}:{prompt_version}"


def strip_code_fence(content: str) -> str:
    """Models asked for JSON sometimes wrap it in a ```json fence; the fence is not the answer."""
    text = content.strip()
    if text.startswith("```") and text.endswith("```") and "\n" in text:
        return text[text.index("\n") + 1 : -3].strip()
    return content


class FlexModels(StrEnum):
    """Which models' flex tier a flex attempt asks for (docs/cost.md)."""

    # Any model's: an OpenAI-compatible provider refuses one without it (a 400 naming service_tier).
    ANY = "any"
    # Those the price table says have one (FLEX_MODELS, or a flex share): Bedrock refuses an unknown tier
    # as a bad request.
    LISTED = "listed"
    # None: the provider sells no flex tier (Anthropic), so flex attempts are standard ones, priced so
    # whatever flex share the prices give a model.
    NONE = "none"


class ModelGateway:
    def __init__(
        self,
        provider: ModelProvider,
        models: ModelTiers,
        prices: PriceTable | None = None,
        repair_attempts: int = 1,
        flex_models: FlexModels = FlexModels.LISTED,
    ) -> None:
        self._provider = provider
        self._models = models
        self._prices = prices or PriceTable()
        self._repair_attempts = repair_attempts
        self._flex_models = flex_models
        # Models whose flex tier the provider refused outright: not asked it again by this gateway.
        self._no_flex: set[str] = set()

    def plan(self, definition: JobDefinition, job_input: BaseModel, attachments: Sequence[Attachment] = ()) -> CallPlan:
        """What an attempt of this job can use at most; computed from its prompt and what was read of its
        attachments, never by a call."""
        prompt = definition.render_prompt(job_input, len(attachments))
        schema = json.dumps(definition.output_schema(job_input), separators=(",", ":"), ensure_ascii=False)
        chain = self._models.chain(definition.model_tier)
        # The attachments go with every call of the attempt (a re-ask resends the conversation); they
        # are priced for the model of the chain that counts them most.
        carried = max((attachment_tokens(self._provider.name, model, attachments) for _, model in chain), default=0)
        first_input = input_token_bound(prompt.system, prompt.user, schema) + carried
        max_output = definition.max_tokens
        worst = Decimal(0)
        for _, model in chain:
            for repair in range(self._repair_attempts + 1):
                worst += self._prices.most(model, first_input + repair * (max_output + REASK_TOKENS), max_output)
        unpriced = tuple(self._prices.unpriced(model for _, model in chain))
        return CallPlan(chain[0][1], first_input + max_output, worst, unpriced)

    def unpriced_models(self) -> list[str]:
        """The configured models that have no price."""
        return self._prices.unpriced(
            dict.fromkeys(model for model in (self._models.primary, self._models.fallback) if model)
        )

    def first_call(self, definition: JobDefinition) -> tuple[str, str]:
        """Who answers an attempt's first call: (the provider, the first model of its job type's tier)."""
        return self._provider.name, self._models.chain(definition.model_tier)[0][1]

    def batch_request(
        self, definition: JobDefinition, job_input: BaseModel, attachments: Sequence[Attachment] = ()
    ) -> CompletionRequest:
        """An attempt's first call, as a line of a provider's batch: to the first model of its chain."""
        prompt = definition.render_prompt(job_input, len(attachments))
        _, model = self.first_call(definition)
        call = Call(definition, prompt, definition.output_schema(job_input), tuple(attachments))
        return self._request(call, model, definition.timeout_seconds)

    def execute(
        self,
        definition: JobDefinition,
        job_input: BaseModel,
        time_left: TimeLeft | None = None,
        attachments: Sequence[Attachment] = (),
        tier: CallTier = CallTier.STANDARD,
        flex_left: TimeLeft | None = None,
    ) -> Execution:
        """One attempt, its calls made now, at the service tier `tier` asks for; a flex call within
        `flex_left` too (what the job's deadline leaves it), as within `time_left`."""
        return self._attempt(definition, job_input, time_left, tuple(attachments), tier=tier, flex_left=flex_left)

    def execute_answer(
        self,
        definition: JobDefinition,
        job_input: BaseModel,
        answered: Answered,
        time_left: TimeLeft | None = None,
        attachments: Sequence[Attachment] = (),
    ) -> Execution:
        """One attempt whose first call a batch made (batch_request's) and answered: that answer, then
        the re-asks and the fallback in real time, as any attempt."""
        return self._attempt(definition, job_input, time_left, tuple(attachments), answered)

    def price_answer(
        self, definition: JobDefinition, job_input: BaseModel, answered: Answered, attachments: int = 0
    ) -> Execution:
        """A batch's answer alone, validated and priced, for a job it no longer holds: neither re-asked
        nor fallen back from (its usage is kept, its output discarded). `attachments` counts the job's
        attachments (not read again): the prompt its request was rendered with depends on it."""
        prompt = definition.render_prompt(job_input, attachments)
        return self._attempt(definition, job_input, None, (), answered, alone=True, prompt=prompt)

    def _attempt(
        self,
        definition: JobDefinition,
        job_input: BaseModel,
        time_left: TimeLeft | None,
        attachments: tuple[Attachment, ...],
        answered: Answered | None = None,
        alone: bool = False,
        prompt: RenderedPrompt | None = None,
        tier: CallTier = CallTier.STANDARD,
        flex_left: TimeLeft | None = None,
    ) -> Execution:
        prompt = prompt or definition.render_prompt(job_input, len(attachments))
        call = Call(definition, prompt, definition.output_schema(job_input), attachments, time_left, flex_left)
        tally = _Tally()
        chain = self._models.chain(definition.model_tier)
        if alone:
            chain = chain[:1]
        for position, (model_tier, model) in enumerate(chain):
            tally.tier, tally.model, tally.conversation = model_tier, model, []
            tally.flex = tier is not CallTier.STANDARD and self._asks_flex(model)
            first = answered if position == 0 else None
            repairs = 0 if alone else self._repair_attempts
            output, error = self._ask(job_input, call, tally, first, repairs, tier)
            last = position == len(chain) - 1
            out_of_time = time_left is not None and time_left() < MIN_CALL_SECONDS
            if error is None or not isinstance(error, _FALLS_BACK) or last or out_of_time:
                return self._execution(prompt, tally, output, error, answered)
            logger.warning(
                "model failed; trying the next tier",
                extra={"job_type": definition.name, "model": model, "error_code": error.code.value},
            )
        raise AssertionError("the model chain is never empty")

    def _ask(
        self,
        job_input: BaseModel,
        call: Call,
        tally: _Tally,
        answered: Answered | None = None,
        repairs: int = 0,
        tier: CallTier = CallTier.STANDARD,
    ) -> tuple[BaseModel | None, JobError | None]:
        """Ask one model, re-asking with the validation error while `repairs` remain; the first answer is
        `answered`'s when a batch gave it."""
        definition = call.definition
        for repair in range(repairs + 1):
            if repair == 0 and answered is not None:
                completion = answered.completion
                for paid in (completion, *answered.extras):
                    tally.calls += 1
                    standard = self._prices.cost(tally.model, paid)
                    tally.add(paid, self._prices.cost(tally.model, paid, Via.BATCH), standard)
            else:
                called = self._call(call, tally, tier)
                if isinstance(called, JobError):
                    return None, called
                completion = called
            try:
                if not completion.content:
                    reason = completion.finish_reason or "unknown"
                    raise SchemaValidationError(f"the model returned no content (finish_reason {reason})")
                return definition.validate_output(job_input, strip_code_fence(completion.content)), None
            except _REPAIRABLE as exc:
                if repair == repairs:
                    tally.refused_answer = valid_text(completion.content) if completion.content else None
                    return None, exc
                tally.reasks += 1
                tally.conversation += [
                    # Sent back as it came, but as valid Unicode: a lone surrogate cannot be encoded.
                    ChatTurn("assistant", valid_text(completion.content)),
                    ChatTurn(
                        "user",
                        REASK.format(reason=bounded(exc.message, REASK_REASON_CHARS)),
                    ),
                ]
            except JobError as exc:
                return None, exc  # not mended by asking again (an answer too large to keep)
            except Exception as exc:
                # A job type's own rule raised: a bug to fix, not the model's fault; the call still counts.
                log_unexpected("the job type's output validation failed unexpectedly", exc, job_type=definition.name)
                return None, InternalError(f"internal error in {definition.name}'s validation: {type(exc).__name__}")
        raise AssertionError("the repair loop always returns")

    def _asks_flex(self, model: str) -> bool:
        """Whether a flex attempt asks `model`'s flex tier: it has one, or may have one, and has not
        refused it."""
        if self._flex_models is FlexModels.NONE or model in self._no_flex:
            return False
        return self._flex_models is FlexModels.ANY or self._prices.offers_flex(model)

    def _call(self, call: Call, tally: _Tally, tier: CallTier) -> Completion | JobError:
        """One call of the attempt: at the flex tier while the attempt asks it of this model, else at the
        standard tier; after flex was unavailable, at the standard tier at once when `tier` says so (the
        deadline is near) or when flex will never serve it, and so for the attempt's further calls."""
        if tally.flex:
            served = self._call_at(call, tally, flex=True, standard_after=tier is CallTier.FLEX_OR_STANDARD)
            if not isinstance(served, FlexUnavailableError):
                return served
            if not served.later:
                self._no_flex.add(tally.model)
            if served.later and tier is not CallTier.FLEX_OR_STANDARD:
                return served  # the job waits for the flex tier
            tally.flex = False
            logger.warning(
                "flex tier unavailable; calling the standard tier",
                extra={"job_type": call.definition.name, "model": tally.model},
            )
        return self._call_at(call, tally, flex=False)

    def _call_at(self, call: Call, tally: _Tally, flex: bool, standard_after: bool = False) -> Completion | JobError:
        """One request, at the flex tier or the standard one, within the time left; its answer priced and
        added to the tally, or the error it met. A flex call may take FLEX_TIMEOUT_SECONDS (less the
        standard call's timeout when one may follow it); one that would get less than the job type's own
        timeout is not made (FlexUnavailableError), nor one that meets a timeout (FlexUnavailableError)."""
        definition = call.definition
        left = call.time_left() if call.time_left is not None else None
        if left is not None and left < MIN_CALL_SECONDS:
            return ProviderTimeoutError("no time left in this invocation for another model call")
        if flex:
            budget = FLEX_TIMEOUT_SECONDS if left is None else min(FLEX_TIMEOUT_SECONDS, left)
            if standard_after and left is not None:
                budget = min(budget, left - definition.timeout_seconds)
            if call.flex_left is not None:
                # Nor past what the deadline leaves it: the standard call that may follow keeps its timeout.
                budget = min(budget, call.flex_left())
            if budget < definition.timeout_seconds:
                return FlexUnavailableError(
                    "too little time left, in this invocation or to the deadline, for a flex call"
                )
            timeout = budget
        else:
            timeout = definition.timeout_seconds if left is None else min(definition.timeout_seconds, left)
        request = self._request(call, tally.model, timeout, tally.conversation, FLEX_TIER if flex else None)
        tally.first_flex = tally.first_flex or (flex and tally.calls == 0)
        tally.calls += 1
        try:
            with provider_call(self._provider.name, tally.model) as record_usage:
                completion = self._provider.complete(request)
                record_usage(genai_usage(completion))
        except ProviderTimeoutError as exc:
            if flex:
                return FlexUnavailableError(f"the flex tier did not answer within {timeout:g}s")
            return exc
        except JobError as exc:
            return exc
        except Exception as exc:
            # A fault of the adapter, not the provider's answer: end the attempt, keep what it cost.
            log_unexpected("the provider adapter failed unexpectedly", exc, job_type=definition.name)
            return InternalError(f"internal error in the provider adapter: {type(exc).__name__}")
        # Priced by the tier the provider says served it (a flex request it served at its standard tier
        # costs the standard price); by the tier asked when it says none.
        at_flex = flex and completion.service_tier in (None, FLEX_TIER)
        via = Via.FLEX if at_flex else Via.REALTIME
        tally.add(
            completion, self._prices.cost(tally.model, completion, via), self._prices.cost(tally.model, completion)
        )
        return completion

    @staticmethod
    def _request(
        call: Call,
        model: str,
        timeout: float,
        conversation: Sequence[ChatTurn] = (),
        service_tier: str | None = None,
    ) -> CompletionRequest:
        definition, prompt = call.definition, call.prompt
        return CompletionRequest(
            model=model,
            system=prompt.system,
            user=prompt.user,
            schema_name=definition.name,
            output_schema=call.output_schema,
            max_tokens=definition.max_tokens,
            timeout_seconds=timeout,
            conversation=tuple(conversation),
            cache_key=prompt_cache_key(definition.name, prompt.version),
            attachments=tuple(call.attachments),
            service_tier=service_tier,
        )

    def _execution(
        self,
        prompt: RenderedPrompt,
        tally: _Tally,
        output: BaseModel | None,
        error: JobError | None,
        answered: Answered | None = None,
    ) -> Execution:
        return Execution(
            prompt=prompt,
            provider=self._provider.name,
            tier=tally.tier,
            model=tally.model,
            output=output,
            error=error,
            input_tokens=tally.input_tokens,
            output_tokens=tally.output_tokens,
            cost_usd=tally.cost_usd,
            latency_ms=tally.latency_ms,
            calls=tally.calls,
            cached_input_tokens=tally.cached_input_tokens,
            cache_write_input_tokens=tally.cache_write_input_tokens,
            reasoning_tokens=tally.reasoning_tokens,
            cache_savings_usd=tally.cache_savings_usd,
            priced=tally.priced,
            batch_id=answered.batch_id if answered else None,
            reasks=tally.reasks,
            refused_answer=tally.refused_answer if isinstance(error, _REPAIRABLE) else None,
            via=Via.BATCH if answered else Via.FLEX if tally.first_flex else Via.REALTIME,
            standard_cost_usd=tally.standard_cost_usd,
            service_tier=tally.service_tier,
        )
