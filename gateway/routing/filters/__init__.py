"""Routing filters: ``eligibility`` (the one rule of which workers may take a request at all), ``speculation``
(the request's speculation mode: ``auto``, ``off`` or ``fast``) and ``placement`` (the fleet plan's pools)."""
