"""The fleet planner (DESIGN §9, issue 25): pools × drafter mode × gear × cap, chosen together from the forecast.

A pure function of what the controller measures and of the time it is given (``PlannerInput.now``, Unix s; no
clock is read here): per traffic class (``"<tier>/<workload>"``) its load — the forecast's band's upper edge
where ``controller.forecast`` has one (``PlannerInput.forecast``), else the rate measured over the ledger window
— its mean prompt and output lengths, its accepted length per k and that estimate's uncertainty
(``controller.planner_pool.estimate_acceptance``), the tiers' SLA targets and speculation modes, each worker's
drafter mode now, which workers the operator lets the plan restart, and the profile's restart time and step-time
model. ``plan_fleet`` returns a ``fleet.plan.FleetPlan``; the pool model is ``controller.planner_pool``.

**Candidates** (``candidates``), every one scored by the same pool model:

- *shared*: one pool with the drafter loaded, its gear left to the per-worker loops (k None): today's controller;
- *shared with a drafter-free part*: for every ``n_off`` = 1 … n, ``n_off`` workers without their drafter (k = 0,
  no idle-drafter tax) beside the loaded rest, the tiers whose ``speculation`` is ``off`` served by the drafter-free
  part alone and every other class by both, balanced on load as the gateway's scorers balance it (``split_rates``:
  the workers filled to an equal request rate, so the drafter-free part takes less of the rest);
  with the plugin's idle-drafter skip (``PlannerConfig.idle_drafter``), also a *free-k0* part: loaded workers
  pinned at k = 0, which serve those tiers with no restart;
- *split*: the classes with a TPOT target in an *interactive* pool, the rest in a *batch* pool, for every pool
  size, each pool's drafter mode, gear (the workers' full-speed gears; k = 0 only without the drafter) and cap.
  Batch overflow spills onto interactive workers while their predicted TPOT stays inside ``(1 − spill_margin)``
  × the interactive target (the gateway's one-way spill rule), which the model counts. A split's pools carry
  their cap (the gateway spills only from a pool at its cap). A split is considered only where it beats the
  shared pool by ``split_gain``.

A class whose tier's ``speculation`` is ``off`` is served only by a pool decoding at k = 0; where a candidate has
none, it counts no goodput for that class (the gateway would refuse it).

**Moves and their cost.** Workers are assigned to a candidate's pools keeping each worker's drafter mode where it
can (``_assign``); a worker whose mode must change is a restart, allowed only for the workers in
``PlannerInput.movable``. A candidate that needs restarts is taken over the best one that needs none only when its
gain over the horizon (``horizon_s``, by default ``horizon_factor`` × restart_s), ``(G_move − G_stay) × horizon``
tokens, exceeds its cost by ``move_margin``: ``restart_s`` × each restarted worker's share of the forecast load,
tokens (counted as lost: the SLA pays for what the others absorb), and only when the fleet less one worker, in
the modes it runs now, still meets every SLA it meets now (``through_restart``: the restarts run one worker at a
time, ``controller.gear_mode``; the classes without a target lose throughput meanwhile, which is the cost). The
plan names the target mode of every pool; the moves themselves, one at a time, the last-healthy-worker rule and
the operator's switches are ``controller.drafter_free``'s.

**Stability** (``plan_fleet``): a new plan replaces the current one only when its predicted goodput beats the
current plan's (re-evaluated on today's inputs) by ``hysteresis``, and the current plan has held for
``min_dwell_s``; otherwise the current pools are republished. With one worker or one class and no mode to change,
the plan is one pool with k None: today's controller.

Units: seconds, tokens, requests/s, tokens/s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from controller.planner_pool import (
    ClassLoad,
    PlannerConfig,
    PoolEstimate,
    WorkerAcceptance,
    estimate_acceptance,
    evaluate_pool,
    prior_accepted_length,
    shared_view,
    spill_limit,
)
from fleet.perf import IdleDrafterMode, Profile
from fleet.plan import ClassForecast, DrafterMode, FleetPlan, PoolPlan, TrafficClass

__all__ = [
    "BATCH_POOL",
    "DRAFTER_FREE_POOL",
    "FREE_K0_POOL",
    "INTERACTIVE_POOL",
    "SHARED_POOL",
    "SPILL_LIMIT_KEY",
    "Candidate",
    "ClassLoad",
    "PlannerConfig",
    "PlannerInput",
    "PoolEstimate",
    "PoolSpec",
    "WorkerAcceptance",
    "candidates",
    "estimate_acceptance",
    "evaluate_pool",
    "plan_fleet",
    "prior_accepted_length",
    "shared_view",
    "spill_limit",
    "split_rates",
    "through_restart",
]

SHARED_POOL = "shared"
DRAFTER_FREE_POOL = "drafter-free"
FREE_K0_POOL = "free-k0"
"""Workers with their drafter loaded pinned at k = 0, where the idle drafter does no work (the plugin's skip)."""
INTERACTIVE_POOL = "interactive"
BATCH_POOL = "batch"
SPILL_LIMIT_KEY = "spill_limit/"
"""``FleetPlan.predicted["spill_limit/<pool>"]``: the in-flight requests per worker of a pool up to which its
predicted TPOT stays inside ``(1 − spill_margin)`` × its tightest TPOT target (the batch spill bound)."""


@dataclass(frozen=True)
class PlannerInput:
    model: str
    workers: tuple[str, ...]
    profile: Profile
    classes: tuple[ClassLoad, ...]
    now: float
    """Unix seconds."""
    max_num_seqs: int
    current: FleetPlan | None = None
    current_since: float = 0.0
    """When ``current``'s pools were first issued (its version), Unix seconds."""
    gears: tuple[int, ...] | None = None
    """The k every worker runs at full speed (None: 0 … k_max)."""
    modes: Mapping[str, DrafterMode] = field(default_factory=dict)
    """Each worker's drafter mode now (a worker left out runs with its drafter loaded)."""
    movable: frozenset[str] = frozenset()
    """Workers the plan may restart into the other drafter mode (the operator's switches allow it)."""
    restart_s: float = 0.0
    """Seconds a worker serves nothing while it restarts (the profile's ``serving.restart_s``)."""
    forecast: Mapping[TrafficClass, ClassForecast] = field(default_factory=dict)
    """Per class, the forecast the plan is sized for: its upper edge replaces the measured rate."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A pool before its workers are named."""

    name: str
    classes: tuple[TrafficClass, ...]
    size: int
    drafter: DrafterMode = "loaded"
    k: int | None = None
    cap: int | None = None


@dataclass(frozen=True)
class Candidate:
    """One way to place the fleet, with its predicted steady state."""

    pools: tuple[PoolPlan, ...]
    goodput_tok_s: float
    estimates: dict[str, PoolEstimate] = field(default_factory=dict)
    spilled_tok_s: float = 0.0
    """Batch tokens/s the model expects the interactive pool to absorb."""
    moves: tuple[str, ...] = ()
    """Workers this candidate restarts into the other drafter mode."""


def planned_loads(inp: PlannerInput) -> tuple[ClassLoad, ...]:
    """The classes as the plan sizes for them: each forecast class at its band's upper edge and forecast lengths."""
    out = []
    for c in inp.classes:
        f = inp.forecast.get(c.name)
        if f is None:
            out.append(c)
            continue
        prompt, output = f.prompt_tokens or c.prompt_tokens, f.output_tokens or c.output_tokens
        out.append(replace(c, rate_req_s=f.upper_rps, prompt_tokens=prompt, output_tokens=output))
    return tuple(out)


def _caps(cfg: PlannerConfig, max_num_seqs: int) -> list[int]:
    return sorted({max_num_seqs if c is None or c >= max_num_seqs else c for c in cfg.caps})


def _gears(inp: PlannerInput) -> list[int]:
    return list(inp.gears if inp.gears is not None else range(inp.profile.drafter.k_max + 1))


def _serves_off(drafter: DrafterMode, k: int | None, cfg: PlannerConfig) -> bool:
    """Whether a pool decodes without drafts (may serve a tier whose ``speculation`` is ``off``): drafter-free,
    or pinned at k = 0 on workers whose idle drafter does no work (the plugin's skip, ``cfg.idle_drafter``)."""
    return drafter == "off" or (k == 0 and cfg.idle_drafter is IdleDrafterMode.PLUGIN)


def _best_pool(
    profile: Profile,
    loads: Sequence[tuple[ClassLoad, float]],
    workers: int,
    settings: Sequence[tuple[DrafterMode, int, int]],
    cfg: PlannerConfig,
) -> tuple[DrafterMode, int, int, PoolEstimate]:
    """The (drafter mode, k, cap) of ``settings`` with the highest predicted goodput (ties: more spare capacity,
    then the larger cap)."""
    best: tuple[tuple[float, float, int], DrafterMode, int, int, PoolEstimate] | None = None
    for drafter, k, cap in settings:
        if any(c.speculation_off for c, r in loads if r > 0) and not _serves_off(drafter, k, cfg):
            continue
        est = evaluate_pool(profile, loads, workers=workers, k=k, cap=cap, cfg=cfg, drafter=drafter)
        key = (round(est.goodput_tok_s, 6), est.spare_seq_steps, cap)
        if best is None or key > best[0]:
            best = (key, drafter, k, cap, est)
    if best is None:
        return "loaded", 0, settings[0][2], PoolEstimate(0.0, 0.0, 0.0, {}, False, 0.0)
    return best[1], best[2], best[3], best[4]


def _settings(
    gears: Sequence[int], caps: Sequence[int], modes: Sequence[DrafterMode]
) -> list[tuple[DrafterMode, int, int]]:
    out: list[tuple[DrafterMode, int, int]] = []
    for mode in modes:
        out += [(mode, k, cap) for k in (gears if mode == "loaded" else [0]) for cap in caps]
    return out


def _takes(pool: PoolSpec | PoolPlan, c: ClassLoad, cfg: PlannerConfig) -> bool:
    """Whether ``pool`` serves class ``c`` (a tier whose ``speculation`` is ``off`` only without drafts)."""
    listed = pool.serves(c.name) if isinstance(pool, PoolPlan) else c.name in pool.classes
    return listed and (not c.speculation_off or _serves_off(pool.drafter, pool.k, cfg))


def split_rates(
    loads: Sequence[ClassLoad], pools: Sequence[PoolSpec | PoolPlan], sizes: Sequence[int], cfg: PlannerConfig
) -> list[list[tuple[ClassLoad, float]]]:
    """Each pool's ``(class, requests/s)``: an ``off`` tier split over the pools decoding without drafts in
    proportion to their workers; every other class as the gateway's load-balancing scorers send it, filling the
    workers of the pools that serve it to an equal request rate per worker on top of what they already carry
    (water-filling, classes taken together per set of pools that serve them): a drafter-free worker that carries
    the ``off`` traffic gets less of the rest. With every class served by one pool, or by pools carrying nothing
    else, this is the split in proportion to workers."""
    out: list[list[tuple[ClassLoad, float]]] = [[] for _ in pools]
    per_worker = [0.0] * len(pools)
    takers = {c.name: [i for i, p in enumerate(pools) if _takes(p, c, cfg)] for c in loads}
    for c in loads:
        if c.speculation_off:
            total = sum(sizes[i] for i in takers[c.name])
            for i in takers[c.name]:
                out[i].append((c, c.rate_req_s * sizes[i] / total))
                per_worker[i] += c.rate_req_s / total
    groups: dict[tuple[int, ...], list[ClassLoad]] = {}
    for c in loads:
        if not c.speculation_off and takers[c.name]:
            groups.setdefault(tuple(takers[c.name]), []).append(c)
    for group, members in groups.items():
        rate = sum(c.rate_req_s for c in members)
        level = _fill_level([per_worker[i] for i in group], [sizes[i] for i in group], rate)
        for i in group:
            share = sizes[i] * max(level - per_worker[i], 0.0)
            for c in members:
                out[i].append((c, c.rate_req_s * share / rate if rate > 0 else 0.0))
            per_worker[i] = max(per_worker[i], level)
    return out


def _fill_level(base: Sequence[float], sizes: Sequence[int], rate: float) -> float:
    """The per-worker level ``L`` with ``Σ size_i · max(L − base_i, 0) = rate`` (requests/s)."""
    order = sorted(range(len(base)), key=lambda i: base[i])
    filled, width = 0.0, 0
    for j, i in enumerate(order):
        width += sizes[i]
        nxt = base[order[j + 1]] if j + 1 < len(order) else float("inf")
        need = (nxt - base[i]) * width
        if filled + need >= rate:
            return base[i] + (rate - filled) / width
        filled += need
    return float("inf")


def score_pools(inp: PlannerInput, loads: Sequence[ClassLoad], pools: Sequence[PoolSpec | PoolPlan],
                cfg: PlannerConfig) -> tuple[float, dict[str, PoolEstimate]]:  # fmt: skip
    """The predicted goodput of ``pools`` serving ``loads``, each class split over the pools that serve it as the
    gateway sends it (``split_rates``); a pool with k None is judged as the per-worker controller judges itself,
    at its best gear (``shared_view``)."""
    total, estimates = 0.0, {}
    sizes = [len(p.workers) if isinstance(p, PoolPlan) else p.size for p in pools]
    for pool, size, mine in zip(pools, sizes, split_rates(loads, pools, sizes, cfg), strict=True):
        cap = (pool.max_concurrency if isinstance(pool, PoolPlan) else pool.cap) or inp.max_num_seqs
        if pool.k is None:
            gears = [0] if pool.drafter == "off" else _gears(inp)
            est = _best_pool(inp.profile, mine, size, _settings(gears, [cap], [pool.drafter]), shared_view(cfg))[3]
        else:
            est = evaluate_pool(inp.profile, mine, workers=size, k=pool.k, cap=cap, cfg=cfg, drafter=pool.drafter)
        total += est.goodput_tok_s
        estimates[pool.name] = est
    return total, estimates


def _assign(inp: PlannerInput, specs: Sequence[PoolSpec]) -> tuple[list[list[str]], tuple[str, ...]] | None:
    """Workers for each pool of ``specs``, keeping each worker's drafter mode where it can: a pool takes the workers
    already in its mode first, those that may not move before those that may (a worker that may not restart can
    serve only a pool of its own mode), then movable workers of the other mode (None when too few may move)."""
    free = list(inp.workers)
    out: list[list[str]] = [[] for _ in specs]
    moves: list[str] = []
    for i, spec in enumerate(specs):
        same = sorted((w for w in free if inp.modes.get(w, "loaded") == spec.drafter), key=lambda w: w in inp.movable)
        out[i] = same[: spec.size]
        free = [w for w in free if w not in out[i]]
    for i, spec in enumerate(specs):
        need = spec.size - len(out[i])
        movers = [w for w in free if w in inp.movable][:need]
        if len(movers) < need:
            return None
        out[i] += movers
        moves += movers
        free = [w for w in free if w not in movers]
    order = {w: j for j, w in enumerate(inp.workers)}
    return [sorted(ws, key=order.__getitem__) for ws in out], tuple(sorted(moves, key=order.__getitem__))


def _candidate(inp: PlannerInput, loads: Sequence[ClassLoad], specs: Sequence[PoolSpec],
               cfg: PlannerConfig) -> Candidate | None:  # fmt: skip
    assigned = _assign(inp, specs)
    if assigned is None:
        return None
    workers, moves = assigned
    pools = tuple(
        PoolPlan(name=s.name, classes=list(s.classes), workers=ws, drafter=s.drafter, k=s.k, max_concurrency=s.cap)
        for s, ws in zip(specs, workers, strict=True)
    )
    goodput, estimates = score_pools(inp, loads, specs, cfg)
    return Candidate(pools, goodput, estimates, 0.0, moves)


def _shared(inp: PlannerInput, loads: Sequence[ClassLoad], cfg: PlannerConfig) -> list[Candidate]:
    """The shared pool, and the shared pool with ``n_off`` = 1 … n of its workers drafter-free."""
    names = tuple(c.name for c in loads)
    spec_ok = tuple(c.name for c in loads if not c.speculation_off)
    n = len(inp.workers)
    out = []
    for n_off in range(n + 1):
        specs = []
        if n_off < n:
            specs.append(PoolSpec(SHARED_POOL, spec_ok if n_off else names, n - n_off))
        if n_off:
            specs.append(PoolSpec(DRAFTER_FREE_POOL, names, n_off, drafter="off", k=0))
        if cand := _candidate(inp, loads, specs, cfg):
            out.append(cand)
    if cfg.idle_drafter is IdleDrafterMode.PLUGIN and len(spec_ok) < len(names):
        for n_k0 in range(1, n):  # the off tiers on loaded workers pinned at k = 0: no restart needed
            specs = [PoolSpec(SHARED_POOL, spec_ok, n - n_k0), PoolSpec(FREE_K0_POOL, names, n_k0, k=0)]
            if cand := _candidate(inp, loads, specs, cfg):
                out.append(cand)
    return out


def _spill(
    profile: Profile,
    interactive: Sequence[tuple[ClassLoad, float]],
    batch_est: PoolEstimate,
    batch_loads: Sequence[tuple[ClassLoad, float]],
    n: int,
    setting: tuple[DrafterMode, int, int],
    cfg: PlannerConfig,
) -> tuple[float, PoolEstimate]:
    """Batch tokens/s the interactive pool can take on top of its own load within the spill margin, and the
    interactive pool's estimate with that spill."""
    drafter, k, cap = setting
    offered = sum(r * c.output_tokens for c, r in batch_loads)
    unserved = max(offered - batch_est.throughput_tok_s, 0.0)
    base = evaluate_pool(profile, interactive, workers=n, k=k, cap=cap, cfg=cfg, drafter=drafter)
    if unserved <= 0 or not batch_loads:
        return 0.0, base
    spill_cfg = replace(cfg, tpot_margin=cfg.spill_margin)
    own = sum(r * c.output_tokens for c, r in interactive)
    lo, hi, best = 0.0, 1.0, base
    for _ in range(8):
        mid = (lo + hi) / 2
        extra = [(c, r * mid * unserved / offered) for c, r in batch_loads]
        est = evaluate_pool(profile, [*interactive, *extra], workers=n, k=k, cap=cap, cfg=spill_cfg, drafter=drafter)
        if not est.saturated and est.goodput_tok_s >= own + sum(r * c.output_tokens for c, r in extra) - 1e-6:
            lo, best = mid, est
        else:
            hi = mid
    return lo * unserved, best


def _splits(inp: PlannerInput, loads: Sequence[ClassLoad], cfg: PlannerConfig) -> list[Candidate]:
    """Every interactive / batch split: pool sizes × each pool's drafter mode, gear and cap (module docstring)."""
    n = len(inp.workers)
    inter = [(c, c.rate_req_s) for c in loads if c.tpot_target_s is not None]
    batch = [(c, c.rate_req_s) for c in loads if c.tpot_target_s is None]
    if n < 2 or not inter or not batch:
        return []
    caps = _caps(cfg, inp.max_num_seqs)
    modes: list[DrafterMode] = ["loaded", "off"] if inp.movable or "off" in inp.modes.values() else ["loaded"]
    settings = _settings(_gears(inp), caps, modes)
    out = []
    for n_i in range(1, n):
        d_b, k_b, cap_b, est_b = _best_pool(inp.profile, batch, n - n_i, settings, cfg)
        for setting in settings:
            if any(c.speculation_off for c, _ in inter) and not _serves_off(setting[0], setting[1], cfg):
                continue
            spilled, est_i = _spill(inp.profile, inter, est_b, batch, n_i, setting, cfg)
            specs = (
                PoolSpec(INTERACTIVE_POOL, tuple(c.name for c, _ in inter), n_i, setting[0], setting[1], setting[2]),
                PoolSpec(BATCH_POOL, tuple(c.name for c, _ in batch), n - n_i, d_b, k_b, cap_b),
            )
            assigned = _assign(inp, specs)
            if assigned is None:
                continue
            workers, moves = assigned
            pools = tuple(
                PoolPlan(name=s.name, classes=list(s.classes), workers=ws, drafter=s.drafter, k=s.k,
                         max_concurrency=s.cap)
                for s, ws in zip(specs, workers, strict=True)
            )  # fmt: skip
            total = est_i.goodput_tok_s + est_b.goodput_tok_s
            out.append(Candidate(pools, total, {INTERACTIVE_POOL: est_i, BATCH_POOL: est_b}, spilled, moves))
    return out


def candidates(inp: PlannerInput, cfg: PlannerConfig) -> list[Candidate]:
    """Every placement the planner considers, each with its predicted goodput; ``[0]`` is the shared pool with
    every worker in the mode it runs now when that needs no restart (see the module docstring)."""
    loads = planned_loads(inp)
    out = sorted(_shared(inp, loads, cfg), key=lambda c: len(c.moves))
    return out + _splits(inp, loads, cfg)


def offered_tok_s(loads: Sequence[ClassLoad]) -> float:
    return sum(c.rate_req_s * c.output_tokens for c in loads)


def move_cost(inp: PlannerInput, cand: Candidate) -> float:
    """Tokens the candidate's restarts cost: ``restart_s`` × each restarted worker's share of the forecast load."""
    if not cand.moves or not inp.workers:
        return 0.0
    return inp.restart_s * len(cand.moves) * offered_tok_s(planned_loads(inp)) / len(inp.workers)


def horizon_s(inp: PlannerInput, cfg: PlannerConfig) -> float:
    return cfg.horizon_s if cfg.horizon_s is not None else cfg.horizon_factor * inp.restart_s


def _current_specs(inp: PlannerInput, loads: Sequence[ClassLoad], without: str | None) -> list[PoolSpec]:
    """The fleet as it runs now (its loaded and its drafter-free workers), less ``without``."""
    names = tuple(c.name for c in loads)
    off = [w for w in inp.workers if inp.modes.get(w, "loaded") == "off" and w != without]
    on = [w for w in inp.workers if inp.modes.get(w, "loaded") == "loaded" and w != without]
    specs = [PoolSpec(SHARED_POOL, names, len(on))] if on else []
    return specs + ([PoolSpec(DRAFTER_FREE_POOL, names, len(off), "off", 0)] if off else [])


def through_restart(inp: PlannerInput, cfg: PlannerConfig, mover: str) -> bool:
    """Whether the fleet less ``mover``, in the modes it runs now, still meets every SLA it meets now: the
    goodput of the classes with a TPOT target (served first, their tiers' priority) is kept. The classes without
    one lose throughput while a worker restarts; that loss is the move's cost (``move_cost``)."""
    sla = [c for c in planned_loads(inp) if c.tpot_target_s is not None]
    if not sla:
        return True
    less = _current_specs(inp, sla, mover)
    if not less:
        return False
    kept = score_pools(inp, sla, less, cfg)[0]
    return kept >= 0.999 * score_pools(inp, sla, _current_specs(inp, sla, None), cfg)[0]


def _choose_stay(cands: Sequence[Candidate], cfg: PlannerConfig) -> Candidate:
    """Among the candidates that restart nothing: the highest predicted goodput, a split counted only where it
    beats the shared pool by ``split_gain``; within 1 % of it, the fewest pools, then the most spare capacity."""
    stay = [c for c in cands if not c.moves]
    shared = stay[0]
    pool = [shared, *(c for c in stay[1:] if len(c.pools) == 1 or
                      c.goodput_tok_s >= (1.0 + cfg.split_gain) * shared.goodput_tok_s)]  # fmt: skip
    top = max(c.goodput_tok_s for c in pool)
    near = [c for c in pool if c.goodput_tok_s >= 0.99 * top]
    return max(
        near,
        key=lambda c: (-len(c.pools), sum(e.spare_seq_steps for e in c.estimates.values()), c.goodput_tok_s),
    )


def choose(inp: PlannerInput, cands: Sequence[Candidate], cfg: PlannerConfig) -> tuple[Candidate, str]:
    """The best candidate and why: the best that restarts nothing, unless one that restarts workers gains more over
    the horizon than its restarts cost, by ``move_margin``, and the fleet less one worker carries the load."""
    stay = _choose_stay(cands, cfg)
    horizon = horizon_s(inp, cfg)
    best, best_net, why = stay, 0.0, ""
    for cand in cands:
        if not cand.moves:
            continue
        gain, cost = (cand.goodput_tok_s - stay.goodput_tok_s) * horizon, move_cost(inp, cand)
        if gain <= cost * (1.0 + cfg.move_margin) or gain - cost <= best_net:
            continue
        if not through_restart(inp, cfg, cand.moves[0]):
            blocked = f"restarting {', '.join(cand.moves)} would gain {gain:.0f} tok for a cost of {cost:.0f} tok"
            why = why or f"{blocked}, but the others cannot carry the forecast through a restart"
            continue
        best, best_net = cand, gain - cost
        why = (f"restart {', '.join(cand.moves)}: gain {gain:.0f} tok over {horizon:.0f} s > cost {cost:.0f} tok "
               f"(restart_s {inp.restart_s:.0f} s × share of the forecast load) + {cfg.move_margin:.0%}")  # fmt: skip
    return best, why


def _evaluate_plan(inp: PlannerInput, plan: FleetPlan, cfg: PlannerConfig) -> float | None:
    """The current plan's predicted goodput on today's inputs (None when it no longer fits the fleet or the
    classes: then it must be replaced)."""
    if sorted(w for p in plan.pools for w in p.workers) != sorted(inp.workers):
        return None
    if any(not plan.pools_for(c.name) for c in inp.classes):
        return None
    return score_pools(inp, planned_loads(inp), plan.pools, cfg)[0]


def _predicted(inp: PlannerInput, cand: Candidate, cfg: PlannerConfig) -> dict[str, float]:
    """The plan's ``predicted``: goodput, spilled tokens, the moves' gain and cost, and per pool its batch,
    per-class TPOT and (pools at a fixed k) its spill limit."""
    out = {"goodput_tok_s": round(cand.goodput_tok_s, 3), "spilled_tok_s": round(cand.spilled_tok_s, 3)}
    if cand.moves:
        out["restarts"] = float(len(cand.moves))
        out["move_cost_tok"] = round(move_cost(inp, cand), 1)
    loads = planned_loads(inp)
    for pool in cand.pools:
        est = cand.estimates[pool.name]
        out[f"batch/{pool.name}"] = round(est.batch, 3)
        for cls, tpot in est.tpot_s.items():
            out[f"tpot_s/{pool.name}/{cls}"] = round(tpot, 5)
        if pool.k is not None:
            mine = [(c, c.rate_req_s) for c in loads if pool.serves(c.name)]
            cap = pool.max_concurrency or inp.max_num_seqs
            limit = spill_limit(inp.profile, mine, workers=len(pool.workers), k=pool.k, cap=cap, cfg=cfg,
                                drafter=pool.drafter)  # fmt: skip
            out[f"{SPILL_LIMIT_KEY}{pool.name}"] = float(limit)
    return out


def _describe(cand: Candidate) -> str:
    parts = []
    for p in cand.pools:
        gear = "k by its loop" if p.k is None else f"k={p.k}"
        mode = ", drafter off" if p.drafter == "off" else ""
        cap = f", cap {p.max_concurrency}" if p.max_concurrency else ""
        parts.append(f"{p.name}: {len(p.workers)} worker(s), {gear}{mode}{cap}, {'+'.join(p.classes)}")
    return "; ".join(parts) + f"; predicted goodput {cand.goodput_tok_s:.0f} tok/s"


def _with_forecast(inp: PlannerInput, pools: Sequence[PoolPlan]) -> list[PoolPlan]:
    """Each pool with the forecast of the classes it serves (what it was sized for)."""
    out = []
    for p in pools:
        mine = {c: f for c, f in inp.forecast.items() if p.serves(c)}
        out.append(p.model_copy(update={"forecast": mine}) if mine or p.forecast else p)
    return out


def _plan(inp: PlannerInput, pools: Sequence[PoolPlan], version: int, reason: str, predicted: dict[str, float],
          cfg: PlannerConfig) -> FleetPlan:  # fmt: skip
    """The plan record; pools new in this version carry the forecast they were sized for, a republished version
    keeps its pools as they were first issued."""
    kept = inp.current is not None and version == inp.current.version
    return FleetPlan(
        model=inp.model,
        version=version,
        issued_at=inp.now,
        ttl_s=cfg.ttl_s,
        pools=list(inp.current.pools) if kept and inp.current is not None else _with_forecast(inp, pools),
        spill_margin=cfg.spill_margin,
        reason=reason,
        predicted=predicted,
    )


def _key(pools: Sequence[PoolPlan]) -> list[tuple[object, ...]]:
    return [(p.name, p.classes, p.workers, p.k, p.max_concurrency, p.drafter) for p in pools]


def plan_fleet(inp: PlannerInput, cfg: PlannerConfig | None = None) -> FleetPlan:
    """The plan for ``inp`` (see the module docstring): the best candidate, or the current plan republished
    when the best does not beat it by ``hysteresis`` or the current plan is younger than ``min_dwell_s``."""
    cfg = cfg or PlannerConfig()
    best, why = choose(inp, candidates(inp, cfg), cfg)
    reason = _describe(best) + (f"; {why}" if why else "")
    current = inp.current
    if current is None:
        return _plan(inp, best.pools, 1, "first plan: " + reason, _predicted(inp, best, cfg), cfg)
    held = _evaluate_plan(inp, current, cfg)
    same = _key(current.pools) == _key(best.pools)
    if held is not None and not same:
        young = inp.now - inp.current_since < cfg.min_dwell_s
        small = best.goodput_tok_s <= held * (1.0 + cfg.hysteresis)
        if young or small:
            kept = f"held {inp.now - inp.current_since:.0f} s < dwell {cfg.min_dwell_s:.0f} s" if young else (
                f"best {best.goodput_tok_s:.0f} tok/s is within {cfg.hysteresis:.0%} of the current {held:.0f}"
            )  # fmt: skip
            predicted = {**current.predicted, "goodput_tok_s": round(held, 3)}
            return _plan(inp, current.pools, current.version, f"kept ({kept}): {current.reason}", predicted, cfg)
    version = current.version if same else current.version + 1
    return _plan(inp, best.pools, version, reason, _predicted(inp, best, cfg), cfg)
