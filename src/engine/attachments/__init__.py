"""Documents and images a job reads: fetched, told apart by their content, checked, before any paid call.

- inspection.py: what an attachment is (media type from its magic bytes, PDF pages, image size),
  read from its bytes without decoding a pixel or rendering a page;
- limits.py: what each provider takes in one request, and the check of a job's attachments against
  it and against its job type;
- loader.py: the loader the runner calls, over a port to the buckets (engine.store.attachments).
docs/attachments.md has the design. PDF and image libraries are imported only when a job has an
attachment of their kind, so that the cold start of text jobs does not grow.
"""
