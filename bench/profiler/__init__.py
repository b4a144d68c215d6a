"""``gearshift profile``: sweep a live worker over (batch size, k), measure step time and acceptance from its
own ``/metrics``, and fit the step-time parameters of a ``fleet.perf.Profile``."""
