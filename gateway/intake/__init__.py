"""Intake stage: who is asking (``auth``), may they (``admission``: rate, tokens, concurrency, budget; with
``replicas``' share during a store outage), and is there room (``overload``: the gate, ``fairqueue``: its policy,
``brownout``). ``session`` and ``tenant_book`` read the request's session header and the tenants in force."""
