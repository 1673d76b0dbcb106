"""Background jobs through the providers' batch APIs, at the batch price, every deadline still met.

A worker claims a background job whose deadline is far enough into a batch window
(engine.batching.intake) and leaves it, with the job's message and input, in a part of that
window in the payload bucket; the message is acknowledged. The batcher, a scheduled function
(engine.batching.batcher), gathers a closed window's parts into one batch per model, records it
(engine.core.batches) before it creates it at the provider (engine.gateway.batches), polls it,
and finishes each job with its answer through the runner, as a real-time answer would be; it hands
back to real time every job its batch failed, did not answer, or would answer too late.
docs/batches.md has the design.
"""
