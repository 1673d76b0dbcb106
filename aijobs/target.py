"""The stack a client acts on, as people name it: the embedded stack, or a deployed stack by name."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.config import Settings

# template.yaml names the jobs queue and the CloudWatch dashboard both `${AWS::StackName}-jobs`
# (tests/unit/test_template.py checks it): a deployed queue's URL names its stack and region.
_STACK_QUEUE = re.compile(r"^https://sqs\.(?P<region>[a-z0-9-]+)\.amazonaws\.com/\d{12}/(?P<stack>[A-Za-z0-9-]+)-jobs$")


@dataclass(frozen=True, slots=True)
class StackTarget:
    """What a client reads and writes: `name` is "embedded stack", the stack's name, or its table's."""

    name: str
    embedded: bool
    table_name: str
    # The stack's CloudWatch dashboard, when it is deployed and its stack known.
    dashboard_url: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings, stack_name: str | None = None, region: str | None = None) -> StackTarget:
        if settings.local_endpoint:
            return cls("embedded stack", True, settings.jobs_table_name)
        match = _STACK_QUEUE.match(settings.jobs_queue_url)
        stack = stack_name or (match.group("stack") if match else None)
        region = region or (match.group("region") if match else None)
        if stack is None:
            return cls(settings.jobs_table_name, False, settings.jobs_table_name)
        return cls(stack, False, settings.jobs_table_name, dashboard_url(stack, region) if region else None)


def dashboard_url(stack: str, region: str) -> str:
    """The console address of a stack's CloudWatch dashboard (template.yaml's DashboardUrl output)."""
    return f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#dashboards:name={stack}-jobs"
