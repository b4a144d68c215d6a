"""The vendored htmx is the pinned release recorded beside it, with its licence."""

from __future__ import annotations

import hashlib
import re

from gateway.http.console.render import HTMX_VERSION, STATIC


def test_the_vendored_htmx_is_the_recorded_release() -> None:
    script = STATIC / f"htmx-{HTMX_VERSION}.min.js"
    record = (STATIC / "VENDORED.md").read_text()
    row = next(line for line in record.splitlines() if line.startswith(f"| `{script.name}`"))
    (recorded,) = re.findall(r"`([0-9a-f]{64})`", row)
    assert hashlib.sha256(script.read_bytes()).hexdigest() == recorded
    assert f"| {HTMX_VERSION} |" in row
    assert "Zero-Clause BSD" in (STATIC / "htmx-LICENSE.txt").read_text()
    assert f'version:"{HTMX_VERSION}"' in script.read_text()
