"""One worker's control tick, stage by stage, in the order the data moves (``ls controller/tick/``):

1. ``collect`` — scrape the worker, cut the counter window, update the estimator, read its control state;
2. ``decide`` — the policy's choice of k (a pure function of the estimate and the profile);
3. ``govern`` — the ordered guards that may hold or change that choice (stabiliser, pool, canary, drafter-free);
4. ``push`` — PUT the governed schedule with a lease, or renew the lease;
5. ``report`` — cost and metrics of the window, and the worker state the gateways read.

``controller.loop`` runs these for every worker, then ticks the fleet hooks (``controller.fleet_hooks``).
"""
