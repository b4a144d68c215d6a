"""Grafana dashboards and SLA rules as code: ``python -m dashboards.build``."""
