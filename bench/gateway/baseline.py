"""Another revision of gearshift as a benchmark target, for before/after comparisons in one run.

``checkout(rev)`` puts the revision's tree in a detached ``git worktree`` (no install: the launcher puts the
tree first on the child's ``sys.path``, so its packages shadow this checkout's). The gateway then runs exactly
as deployed from that tree, interleaved with today's code on the same upstream, Redis and CPUs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class BaselineError(RuntimeError):
    """The revision could not be checked out."""


@contextmanager
def checkout(rev: str, into: Path) -> Iterator[Path]:
    """The tree of ``rev`` (any git revision) at ``into``, removed again on exit."""
    try:
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", "--force", str(into), rev],
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
        raise BaselineError(f"--baseline {rev}: cannot check it out: {detail}") from None
    try:
        yield into
    finally:
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(into)], check=False, capture_output=True
        )


def gateway_entry(source: Path | None) -> str:
    """Python code that runs the ``gearshift`` CLI of ``source`` (this checkout when None), whichever module
    layout that revision has (``gearshift/cli/app.py`` since issue 11, ``gearshift/cli.py`` before)."""
    if source is None:
        return "from gearshift.cli.app import main; main()"
    module = "gearshift.cli.app" if (source / "gearshift" / "cli" / "app.py").exists() else "gearshift.cli"
    return f"import sys; sys.path.insert(0, {str(source)!r}); from {module} import main; main()"
