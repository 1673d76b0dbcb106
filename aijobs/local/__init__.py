"""The embedded stack: a local AWS endpoint (aws, moto_patches), a local OpenAI-compatible provider
(provider, protocol, answers, faults), the local event source mapping (poller, lambda_events) and
devstack, which runs them together. Import what you use from its module.
"""
