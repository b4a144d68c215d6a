"""The compiled lab modules (``workers.sim.native``) are loaded only for the very sources they were compiled from,
by this interpreter, and only when every one is there: anything else loads the sources."""

from __future__ import annotations

import json
from pathlib import Path

from workers.sim.native import digest, suffix, usable


def _build(tmp: Path, sources: dict[str, str], *, built_for: str | None = None) -> tuple[Path, Path]:
    """A package of ``sources`` and a native tree compiled (as far as the manifest says) from them."""
    package, root = tmp / "src", tmp / "native"
    package.mkdir()
    (root / "workers" / "sim").mkdir(parents=True)
    for name, text in sources.items():
        (package / f"{name}.py").write_text(text)
        (root / "workers" / "sim" / f"{name}{built_for or suffix()}").write_bytes(b"")
    manifest = {"suffix": built_for or suffix(), "modules": {n: digest(n, package) for n in sources}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root, package


def test_a_build_of_the_current_sources_is_used(tmp_path: Path) -> None:
    root, package = _build(tmp_path, {"engine": "x = 1\n", "adaptive": "y = 2\n"})
    assert usable(root, package)[0]


def test_an_edited_source_falls_back(tmp_path: Path) -> None:
    root, package = _build(tmp_path, {"engine": "x = 1\n", "adaptive": "y = 2\n"})
    (package / "adaptive.py").write_text("y = 3\n")
    ok, why = usable(root, package)
    assert not ok
    assert "adaptive.py changed" in why


def test_a_missing_library_falls_back(tmp_path: Path) -> None:
    root, package = _build(tmp_path, {"engine": "x = 1\n", "adaptive": "y = 2\n"})
    (root / "workers" / "sim" / f"engine{suffix()}").unlink()
    assert not usable(root, package)[0]


def test_a_build_for_another_interpreter_falls_back(tmp_path: Path) -> None:
    root, package = _build(tmp_path, {"engine": "x = 1\n"}, built_for=".cpython-27-x86_64-linux-gnu.so")
    assert not usable(root, package)[0]


def test_no_build_falls_back(tmp_path: Path) -> None:
    assert not usable(tmp_path / "nowhere", tmp_path)[0]
