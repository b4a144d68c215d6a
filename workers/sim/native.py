"""The lab's hot modules compiled with mypyc (optional, issue 29): the same source, the same results, faster.

    python -m workers.sim.native_build build    # compile MODULES into build/lab-native/ (a C compiler; ~1-3 min)
    python -m workers.sim.native_build status   # whether the compiled modules are in use, and why not
    python -m workers.sim.native_build clean    # remove them (the pure-Python modules are used again)

Nothing changes for a checkout that never builds: the compiled modules live outside the source tree, under
``build/lab-native/`` (git-ignored), with a manifest of the SHA-256 of each source they were compiled from and the
interpreter's extension suffix. ``workers/sim/__init__.py`` puts that directory first on the package's
``__path__`` only when every compiled module's source is unchanged (``usable``), so an edited module, another
interpreter or a half-finished build silently falls back to the pure-Python modules: a stale build can never run.

Compiled and pure modules give bit-identical lab results (``python -m bench.replay.fingerprint``: same draws in
the same order, the same IEEE double operations); mypyc only removes the interpreter's dispatch. Each module is
its own compilation group (``separate=True``), so its shared library sits beside it in the package.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
ROOT = PACKAGE_DIR.parents[1]
NATIVE_ROOT = ROOT / "build" / "lab-native"
"""Where the compiled package tree goes (``build/`` is git-ignored)."""
NATIVE_DIR = NATIVE_ROOT / "workers" / "sim"
MANIFEST = NATIVE_ROOT / "manifest.json"
MODULES: tuple[str, ...] = ("engine", "scheduler", "adaptive", "stats", "prefix_cache")
"""The modules compiled: the engine step (the lab's largest cost), its waiting queues, adaptive verification, the
engine's counters and its prefix cache. Not ``virtual`` (its Protocols would become traits no Python class may
implement) nor ``records`` (the bench builds and reads its records everywhere)."""


def digest(module: str, package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 of the module's source, ``workers/sim/{module}.py``."""
    return hashlib.sha256((package_dir / f"{module}.py").read_bytes()).hexdigest()


def suffix() -> str:
    """The file suffix of this interpreter's extension modules."""
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def usable(root: Path = NATIVE_ROOT, package_dir: Path = PACKAGE_DIR) -> tuple[bool, str]:
    """Whether the compiled modules under ``root`` may be used for the sources in ``package_dir``, and the reason
    when not."""
    manifest_path, native_dir = root / "manifest.json", root / "workers" / "sim"
    if not manifest_path.exists():
        return False, f"not built ({manifest_path} missing): python -m workers.sim.native_build build"
    try:
        manifest = json.loads(manifest_path.read_text())
        modules: dict[str, str] = manifest["modules"]
        built_for: str = manifest["suffix"]
    except (OSError, ValueError, KeyError, TypeError):
        return False, f"{manifest_path} unreadable"
    if built_for != suffix():
        return False, f"built for {built_for}, this interpreter loads {suffix()}"
    for module, want in modules.items():
        if not (native_dir / f"{module}{built_for}").exists():
            return False, f"{module}{built_for} missing"
        if not (package_dir / f"{module}.py").exists() or digest(module, package_dir) != want:
            return False, f"workers/sim/{module}.py changed since it was compiled: build again"
    return True, f"compiled: {', '.join(sorted(modules))}"
