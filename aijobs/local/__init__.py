"""The embedded stack: a local AWS endpoint (aws, moto_patches), a local OpenAI-compatible provider
(provider, protocol, answers, faults, and batches: its Files and Batches APIs), the local event
source mapping (poller, lambda_events) and devstack, which runs them together. Import what you use
from its module.
"""
