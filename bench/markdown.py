"""Small Markdown helpers shared by the reports: pipe tables and number formatting."""

from __future__ import annotations

import math
from collections.abc import Sequence


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, align: str | None = None) -> str:
    """A GitHub pipe table. ``align`` is one letter per column (``l``/``r``); numbers default to right."""
    cells = [[_cell(v) for v in row] for row in rows]
    if align is None:
        align = "".join("r" if rows and isinstance(rows[0][i], int | float) else "l" for i in range(len(header)))
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return fmt(value)
    return str(value).replace("|", "\\|")


def fmt(value: float | None, digits: int = 3) -> str:
    """A number with about ``digits`` significant digits; '—' for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    decimals = max(0, digits - 1 - math.floor(math.log10(magnitude)))
    return f"{value:.{decimals}f}"


def pct(value: float | None) -> str:
    """A ratio as a percentage ('—' for None)."""
    return "—" if value is None or math.isnan(value) else f"{100 * value:.1f} %"


def parse_table(markdown: str, heading: str) -> tuple[list[str], list[list[str]]]:
    """The first pipe table after the line ``heading`` (for tests and tools reading a report back)."""
    lines = markdown.splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    if len(rows) < 2:
        raise ValueError(f"no table after {heading!r}")
    return rows[0], rows[2:]
