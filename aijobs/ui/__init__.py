"""The web dashboard of `aijobs ui` (docs/ui.md): pages over the client the CLI uses, on 127.0.0.1.

- app.py: the pages and actions (Starlette, Jinja2 templates with autoescape)
- guard.py: the Host and same-origin checks and the security headers of every answer
- queries.py: what a page's query string asks for
- present.py: how numbers, times, texts, batch keys and the cost chart are written
- overview.py: a window's jobs counted by state and error code, and charted over time
- bulk.py: the bulk retry of the failed jobs a page shows
- server.py: uvicorn on a socket bound first (port 0 works)
"""
