"""The one Logger, Tracer and Metrics of the engine (Powertools). Prompts, inputs and outputs are never logged."""

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger(service="aijobs")
tracer = Tracer(service="aijobs")
metrics = Metrics(namespace="aijobs", service="aijobs")
