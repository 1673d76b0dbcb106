"""Lambda entry point of the scheduled reconciler."""

from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from engine.observability import logger, metrics, traced
from engine.reconciler import get_reconciler


@traced
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext | None) -> dict[str, int]:
    logger.append_keys(function_request_id=getattr(context, "aws_request_id", None))
    report = get_reconciler().run(getattr(context, "get_remaining_time_in_millis", None))
    for fate, count in report.items():
        metrics.add_metric(name=f"Reconciled_{fate}", unit=MetricUnit.Count, value=count)
    return dict(report)
