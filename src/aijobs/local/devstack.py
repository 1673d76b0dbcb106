"""The embedded stack of `aijobs dev` and `aijobs demo`: everything `sam deploy` makes, on one machine.

- a local AWS endpoint (moto) with the queue, dead-letter queue and table created from
  template.yaml's own properties;
- a local OpenAI-compatible provider over real HTTP (or the one AI_BASE_URL names);
- the worker and dead-letter functions, run in this process by local event source mappings
  with Lambda's batch shape, partial batch responses and the template's timeouts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import boto3

from aijobs.local.aws import LocalAws
from aijobs.local.poller import EventSourceMapping
from aijobs.local.provider import LocalProvider
from aijobs.stack import DEFAULT_TEMPLATE, create_stack_resources, function_timeout, load_template

# The model id the local provider answers as; priced like the real one, so the demo shows costs.
LOCAL_MODEL = "gpt-4o-mini"
LOCAL_API_KEY = "local-key"
LOCAL_WAIT_SECONDS = 1
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True, slots=True)
class DevStackOptions:
    aws_port: int = 5000
    provider_port: int = 8700
    # When set, jobs go to this OpenAI-compatible endpoint instead of the local provider.
    ai_base_url: str | None = None
    provider_latency_seconds: float = 0.3
    fault_rate: float = 0.0
    concurrency: int = 2
    stack_name: str = "aijobs"


class DevStack:
    def __init__(self, options: DevStackOptions | None = None) -> None:
        self.options = options or DevStackOptions()
        self._aws = LocalAws(port=self.options.aws_port)
        self.provider: LocalProvider | None = None
        self._mappings: list[EventSourceMapping] = []
        self.environment: dict[str, str] = {}

    def start(self) -> DevStack:
        """Start everything; this process's environment then points at the stack."""
        options = self.options
        self._aws.start()
        aws_environment = {"AWS_ENDPOINT_URL": self._aws.endpoint_url, **LOCAL_CREDENTIALS}
        os.environ.update(aws_environment)
        resources = create_stack_resources(options.stack_name, session=boto3.Session())
        if options.ai_base_url:
            ai_environment = {"AI_BASE_URL": options.ai_base_url}
        else:
            self.provider = LocalProvider(
                port=options.provider_port,
                api_key=LOCAL_API_KEY,
                latency_seconds=options.provider_latency_seconds,
                fault_rate=options.fault_rate,
            ).start()
            ai_environment = {
                "AI_BASE_URL": self.provider.url,
                "AI_API_KEY": LOCAL_API_KEY,
                "AI_MODEL_PRIMARY": LOCAL_MODEL,
            }
        self.environment = aws_environment | resources.environment() | {"AI_PROVIDER": "openai"} | ai_environment
        os.environ.update(self.environment)
        self._start_functions(resources.queue_url, resources.dlq_url)
        return self

    def _start_functions(self, queue_url: str, dlq_url: str) -> None:
        # Imported here: the engine reads its settings from the environment set up above.
        from engine.config import get_settings
        from engine.dead_letters import get_recorder
        from engine.worker import get_worker
        from handlers import dead_letter, worker

        for cached in (get_settings, get_worker, get_recorder):
            cached.cache_clear()
        template = load_template(DEFAULT_TEMPLATE)
        # Short long polls: a local endpoint costs nothing per receive, and stop() waits one out.
        self._mappings = [
            EventSourceMapping(
                queue_url,
                worker.lambda_handler,
                function_timeout_seconds=function_timeout(template, "WorkerFunction"),
                concurrency=self.options.concurrency,
                function_name="aijobs-worker",
                wait_seconds=LOCAL_WAIT_SECONDS,
            ).start(),
            EventSourceMapping(
                dlq_url,
                dead_letter.lambda_handler,
                function_timeout_seconds=function_timeout(template, "DeadLetterFunction"),
                function_name="aijobs-dead-letters",
                wait_seconds=LOCAL_WAIT_SECONDS,
            ).start(),
        ]

    def stop(self) -> None:
        for mapping in self._mappings:
            mapping.stop()
        if self.provider is not None:
            self.provider.stop()
        self._aws.stop()

    def __enter__(self) -> DevStack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
