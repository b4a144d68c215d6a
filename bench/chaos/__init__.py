"""``gearshift bench chaos``: the fault matrix under load on real processes (issue 23). In the order data moves:
``proxy`` (the fault-injecting worker proxy, shared with the reliability tests), ``stack`` (the processes),
``load`` (the clients), ``faults`` (what is injected and healed), ``measure`` (what the clients and the ledger
saw), ``run`` (the sequence), ``report`` (the invariants and ``docs/benchmarks/chaos.md``)."""
