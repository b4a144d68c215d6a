"""Routing scorers, each a plug-in with its formula in its docstring: ``queue`` and ``kv_cache`` (load),
``speculation`` (the worker's gear against the tier's preference), ``ttft`` (predicted time to first token),
``prefix`` (prefix-cache affinity)."""
