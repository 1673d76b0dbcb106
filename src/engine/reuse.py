"""Answers already paid for (docs/reuse.md): a job whose request is the same as one that succeeded within
its job type's `reuse_seconds` takes that job's answer, and no provider call is made.

Two requests are the same when everything that decides the answer is: the job type and its version,
who answers the first call (provider and model), the rendered prompt, the attachments' sha256 and the
output schema. `request_key` is the sha256 of those as canonical JSON. The user is not part of it:
the same question has the same answer whoever asks it (docs/reuse.md says what that means).

- `find`, once a job is claimed: one read of the answer kept under its request's key. A fresh one is
  checked as a model's answer is (the output schema and the rules of the job's version) and projected
  as the job stores it. Whatever goes wrong on the way (the read fails, the answer is stale, its version
  no longer takes it) is a miss: the job calls the model, as it would with reuse off.
- `kept`, once a call answered: what the finish keeps, under the key of the request that was answered.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from engine.core import PaidAnswer, Reusable
from engine.core.attachments import AttachmentInfo
from engine.core.errors import JobError
from engine.core.ports import PaidAnswers
from engine.definitions import JobDefinition, RenderedPrompt
from engine.gateway import Execution
from engine.intake import canonical_json, sha256_hex
from engine.observability import log_unexpected, logger

# Who answers a job type's first call: (provider, model); engine.gateway.ModelGateway.first_call.
FirstCall = Callable[[JobDefinition], tuple[str, str]]


def request_key(
    definition: JobDefinition,
    prompt: RenderedPrompt,
    provider: str,
    model: str,
    output_schema: dict[str, Any],
    attachments: Sequence[AttachmentInfo],
) -> str:
    """The sha256 of everything that decides an answer, as canonical JSON: two jobs of one key ask the
    same model the same thing, for an answer of the same shape."""
    request = {
        "job_type": definition.name,
        "job_type_version": definition.job_type_version,
        "schema_version": definition.schema_version,
        "provider": provider,
        "model": model,
        "prompt": [prompt.key, prompt.version, prompt.system, prompt.user],
        "attachments": [attachment.sha256 for attachment in attachments],
        "output_schema": output_schema,
    }
    return sha256_hex(canonical_json(request))


@dataclass(frozen=True, slots=True)
class Reused:
    """An answer a job takes from the job that paid for it: that answer, the output the job stores from
    it, and the request it answers (its prompt, and who answered it)."""

    paid: PaidAnswer
    output: dict[str, Any]
    prompt: RenderedPrompt
    provider: str
    model: str


class AnswerReuse:
    def __init__(self, answers: PaidAnswers, first_call: FirstCall) -> None:
        self._answers = answers
        self._first_call = first_call

    def find(
        self, definition: JobDefinition, job_input: BaseModel, attachments: Sequence[AttachmentInfo], now_ms: int
    ) -> Reused | None:
        """The answer this job's request was given within its job type's reuse_seconds, checked and
        projected for this job; None when there is none (or the job type reuses none), never an error."""
        seconds = definition.reuse_seconds
        if not seconds:
            return None
        try:
            provider, model = self._first_call(definition)
            prompt = definition.render_prompt(job_input, len(attachments))
            schema = definition.output_schema(job_input)
            paid = self._answers.paid_answer(request_key(definition, prompt, provider, model, schema, attachments))
            if paid is None or not paid.fresh(now_ms, seconds):
                return None
            output = definition.stored_output(definition.validate_output(job_input, paid.answer))
        except JobError as refused:
            # Its version's rules changed since (a code job type's deploy): this job asks the model.
            logger.info(
                "a kept answer no longer passes; the job calls the model",
                extra={"job_type": definition.name, "error_code": refused.code.value},
            )
            return None
        except Exception as exc:
            log_unexpected("no kept answer could be read; the job calls the model", exc, job_type=definition.name)
            return None
        return Reused(paid, output, prompt, provider, model)

    def kept(
        self,
        definition: JobDefinition,
        job_input: BaseModel,
        attachments: Sequence[AttachmentInfo],
        execution: Execution,
    ) -> Reusable | None:
        """What the finish of a job whose call answered keeps for later jobs of the same request: its
        answer, under the key of the request the answer came from (a fallback model's answer is kept for
        requests to that model). None when the job type reuses no answers, or there is no answer."""
        seconds = definition.reuse_seconds
        if not seconds or execution.output is None:
            return None
        try:
            schema = definition.output_schema(job_input)
            key = request_key(definition, execution.prompt, execution.provider, execution.model, schema, attachments)
            answer = json.dumps(execution.output.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)
        except Exception as exc:
            log_unexpected("an answer could not be kept for reuse", exc, job_type=definition.name)
            return None
        return Reusable(key, answer, seconds)
