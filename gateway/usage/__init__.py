"""Account stage: the usage record and its ledger writer (``metering``, ``spool``), the admin ``audit`` trail,
``metrics`` and ``tracing``."""
