"""The OpenAI-compatible gateway. Its folders are the request path in the order data moves:

``http`` (the edge: routes, body limits, the ASGI entry) → ``intake`` (authenticate, admit against the tenant's
limits, the overload gate and its fair queue, brownout) → ``routing`` (filters → scorers → pick → post-pick hooks)
→ ``upstream`` (the API shape's body, the hold on a worker, relaying its stream) → ``usage`` (metering, the
ledger's spool, audit, metrics, traces). ``pipeline`` walks one request through them; ``wiring`` builds every
resource from the settings once.
"""
