"""The policy report in pieces: every run of ``gearshift bench policies`` stores each (profile, scenario) it ran
under ``<out>/policies-runs/``, and the report is written from every piece stored there, so a run of one profile
and one scenario (``--profile P --scenario S``) replaces that piece and keeps the others. The pieces are pickles
of ``SuiteResult`` slices, local to the machine and the code that wrote them (not for the repository): a piece
written by other code that no longer loads is named in the error, to be run again."""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.policy.suite import SuiteResult

PIECES = "policies-runs"
"""The pieces' directory under the report's ``--out``."""
FORMAT = 1

PER_SCENARIO = ("runs", "oracle_choice", "baselines", "capacities", "ceilings", "knees", "refs")
"""``SuiteResult``'s fields keyed by scenario (``runs`` and ``refs`` by a tuple that starts with it)."""
PER_PROFILE = ("profile", "static_ks", "restart_s")
"""``SuiteResult``'s fields that are the profile's, the same in every piece of it."""


class PieceError(RuntimeError):
    """A stored piece that does not load or does not fit the others."""


def _mine(key: object, scenario: str) -> bool:
    return (key[0] if isinstance(key, tuple) else key) == scenario


def split(result: SuiteResult) -> dict[str, SuiteResult]:
    """``result`` as one piece per scenario it ran or skipped (scenario name → piece)."""
    out: dict[str, SuiteResult] = {}
    for sc in result.scenarios:
        piece = SuiteResult([sc], **{f: getattr(result, f) for f in PER_PROFILE})
        for f in PER_SCENARIO:
            setattr(piece, f, {k: v for k, v in getattr(result, f).items() if _mine(k, sc.name)})
        out[sc.name] = piece
    for name in result.skipped:
        out[name] = SuiteResult([], skipped=[name], **{f: getattr(result, f) for f in PER_PROFILE})
    return out


def merge(pieces: Sequence[SuiteResult]) -> SuiteResult:
    """One profile's pieces as one result, scenarios by name (as ``load_scenarios`` orders them)."""
    if not pieces:
        raise ValueError("merge: no pieces")
    first = pieces[0]
    for p in pieces[1:]:
        for f in PER_PROFILE:
            if getattr(p, f) != getattr(first, f):
                raise PieceError(f"pieces of {first.profile} disagree on {f}: {getattr(p, f)} vs {getattr(first, f)}")
    out = SuiteResult([], **{f: getattr(first, f) for f in PER_PROFILE})
    for p in sorted(pieces, key=lambda p: p.scenarios[0].name if p.scenarios else p.skipped[0]):
        out.scenarios += p.scenarios
        out.skipped += p.skipped
        for f in PER_SCENARIO:
            getattr(out, f).update(getattr(p, f))
    return out


def _path(out: Path, profile: str, scenario: str) -> Path:
    return out / PIECES / profile / f"{scenario}.pickle"


def save(results: Mapping[str, SuiteResult], out: Path) -> None:
    """Store every (profile, scenario) piece of ``results`` under ``out``, replacing those stored before."""
    for profile, result in results.items():
        for scenario, piece in split(result).items():
            path = _path(out, profile, scenario)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps({"format": FORMAT, "piece": piece}))
            tmp.replace(path)


def load(out: Path) -> dict[str, SuiteResult]:
    """Every piece stored under ``out``, merged per profile (profiles by name)."""
    by_profile: dict[str, list[SuiteResult]] = {}
    for path in sorted((out / PIECES).glob("*/*.pickle")):
        try:
            stored = pickle.loads(path.read_bytes())  # written by save() on this machine
        except Exception as exc:  # a piece pickled by other code: any unpickling error
            raise PieceError(f"{path}: does not load ({exc}); run that profile and scenario again") from exc
        if not isinstance(stored, dict) or stored.get("format") != FORMAT:
            raise PieceError(f"{path}: not a piece of format {FORMAT}; run that profile and scenario again")
        by_profile.setdefault(path.parent.name, []).append(stored["piece"])
    return {name: merge(pieces) for name, pieces in sorted(by_profile.items())}


def store(results: Mapping[str, SuiteResult], out: Path) -> dict[str, SuiteResult]:
    """``save`` then ``load``: what the report is written from."""
    save(results, out)
    return load(out)
