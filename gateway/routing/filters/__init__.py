"""Routing filters: ``eligibility`` (the one rule of which workers may take a request at all) and ``placement``
(the fleet plan's pools)."""
