"""Route stage: which worker serves a request, as a package of plug-ins in the shape of llm-d's scheduler.

``context`` (what every plug-in sees) → ``filters`` (``eligibility``: the one ``routable`` rule; ``speculation``:
the request's speculation mode; ``placement``: the fleet plan's pools) → ``scorers`` (queue, KV cache,
speculation, TTFT, prefix) → ``picker`` (best first) → ``hooks`` (post-pick: the prefix index records).
``router`` composes them; ``pool`` is the fleet as the router sees it; ``prefix`` the prompt blocks and their
index.
"""
