"""Console fixtures: the gateway tests' fake workers on loopback."""

from __future__ import annotations

from tests.gateway.conftest import upstreams

__all__ = ["upstreams"]
