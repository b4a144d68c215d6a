"""Every repository path the hand-written docs name exists, so a moved or deleted file fails here, not in a reader's
hands. The generated reports (``docs/benchmarks/``) are left to the commands that write them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGES = ("fleet", "workers", "controller", "gateway", "bench", "gearshift", "dashboards")
TOP_LEVEL = (*PACKAGES, "deploy", "scripts", "tests", "docs")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(rf"^(?:{'|'.join(TOP_LEVEL)})/[A-Za-z0-9_./-]*$")
FILE_SUFFIXES = {"md", "json", "py", "yaml", "yml", "png", "sh"}  # `gateway.md` is a file name, not a module
DOTTED = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def hand_written_pages() -> list[Path]:
    generated = DOCS / "benchmarks"
    pages = [p for p in DOCS.rglob("*.md") if generated not in p.parents or p.name == "index.md"]
    return sorted([*pages, ROOT / "README.md"])


def named_paths(text: str) -> set[str]:
    """Code spans that are repository paths: ``gateway/pipeline.py``, ``deploy/kubernetes/base``, and the file of a
    test id (``tests/x/test_y.py::test_z``)."""
    spans = (span.split("::", 1)[0].strip() for span in CODE_SPAN.findall(text))
    return {span.rstrip("/") for span in spans if PATH.match(span)}


def test_the_pattern_finds_paths_and_only_paths() -> None:
    text = "`gateway/pipeline.py`, `tests/fleet/test_tier_fields.py::test_x`, `fleet.stats`, `GEARSHIFT_X`, `deploy/`"
    assert named_paths(text) == {"gateway/pipeline.py", "tests/fleet/test_tier_fields.py", "deploy"}
    assert named_modules("`fleet.stats.percentile`, `fleet/stats.py`, `flee.x`, `gateway.md`") == {
        "fleet.stats.percentile"
    }
    assert module_exists("fleet.stats.percentile")
    assert not module_exists("fleet.no_such_module")


def named_modules(text: str) -> set[str]:
    """Code spans that start with a dotted gearshift name: ``gateway.errors.respond``, ``fleet.plan.FleetPlan``."""
    found = (DOTTED.match(span) for span in CODE_SPAN.findall(text))
    return {m.group(0) for m in found if m is not None and m.group(0).rsplit(".", 1)[-1] not in FILE_SUFFIXES}


def module_exists(dotted: str) -> bool:
    """Some prefix of ``dotted`` longer than the package alone is a module or a package of the repository (the rest
    being names inside it)."""
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        base = ROOT.joinpath(*parts[:end])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


@pytest.mark.parametrize("page", hand_written_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_a_page_names_exists(page: Path) -> None:
    missing = sorted(m for m in named_modules(page.read_text(encoding="utf-8")) if not module_exists(m))
    assert not missing, f"{page.relative_to(ROOT)} names modules that do not exist: {missing}"


@pytest.mark.parametrize("page", hand_written_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page: Path) -> None:
    missing = sorted(p for p in named_paths(page.read_text(encoding="utf-8")) if not (ROOT / p).exists())
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"
