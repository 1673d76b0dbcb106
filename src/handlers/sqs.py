"""What the SQS functions (the worker, the dead-letter function) share: a record as a Delivery."""

from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from engine.core import Delivery, Lane
from engine.queue import REALTIME_ROUTE, ROUTE_ATTRIBUTE


def delivery_of(record: SQSRecord, lane: Lane = Lane.INTERACTIVE) -> Delivery:
    """The delivery an SQS record is, received from the queue of `lane`."""
    route = (record.raw_event.get("messageAttributes") or {}).get(ROUTE_ATTRIBUTE) or {}
    return Delivery(
        message_id=record.message_id,
        body=record.body,
        receive_count=int(record.attributes.approximate_receive_count or 1),
        attributes=dict(record.raw_event.get("attributes") or {}),
        lane=lane,
        realtime=route.get("stringValue") == REALTIME_ROUTE,
    )
