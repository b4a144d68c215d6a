"""The README's status quotes only committed reports (issue 27): every number in a bullet of its "Status" section
appears in a report that bullet links to (a bullet that says "same report" uses the previous bullet's). A report
regenerated without the README following fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_NUMBER = re.compile(r"(?<![\w.])(?:\d{1,3}(?:[,\u202f ]\d{3})+|\d+)(?:\.\d+)?(?![\w])")
_LINK = re.compile(r"\]\(((?:docs)/[\w/.-]+\.md)(?:#[\w-]+)?\)")


def _numbers(text: str) -> set[float]:
    """Every number in ``text`` by value, thousands separators (``,``, spaces) dropped: ``2,109`` and ``2 109`` are
    2109, ``42`` and ``42.0`` the same."""
    return {float(re.sub(r"[,\u202f ]", "", match.group(0))) for match in _NUMBER.finditer(text)}


def status_bullets(readme: str) -> list[tuple[str, list[Path]]]:
    """Each bullet of the Status section and the reports it quotes."""
    section = readme.split("## Status", 1)[1].split("\n## ", 1)[0]
    bullets: list[tuple[str, list[Path]]] = []
    for text in re.split(r"\n- ", section)[1:]:
        links = [ROOT / link for link in _LINK.findall(text)]
        if not links and "same report" in text and bullets:
            links = bullets[-1][1]
        bullets.append((text, links))
    return bullets


def test_every_status_figure_is_in_a_report_its_bullet_links() -> None:
    bullets = status_bullets((ROOT / "README.md").read_text())
    assert len(bullets) >= 5
    for text, links in bullets:
        assert links, f"a status bullet quotes no report: {text[:80]!r}"
        quoted = set().union(*(_numbers(path.read_text()) for path in links))
        missing = sorted(n for n in _numbers(text.split("\n\n", 1)[0]) if n not in quoted)
        assert not missing, f"{text[:60]!r}: {missing} are in none of {[str(p.relative_to(ROOT)) for p in links]}"


def test_numbers_are_compared_without_their_separators() -> None:
    assert {2109, 1.07, 97} <= _numbers("2,109 req/s, 1.07 ms, 97 %")
    assert 2109 in _numbers("2 109 req/s")
    assert 26 not in _numbers("k26 x2.6")
    assert _numbers("1,333 32-chunk streams") == {1333, 32}
    assert _numbers("42.0 %") == _numbers("42 %")
