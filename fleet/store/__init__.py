"""The shared state every gateway replica and controller meets in (DESIGN §3.3).

``protocol`` is the contract (the ``Store`` protocol and its records); ``memory`` and ``redis`` implement it with
the same semantics (``redis`` on one Redis or on Redis Cluster); ``keys`` is the cluster-safe key layout;
``window``, ``ledger`` and ``lua`` are the algorithms they share; ``factory`` picks one from the settings;
``cancel`` keeps a store call's cancellation honest.
"""
