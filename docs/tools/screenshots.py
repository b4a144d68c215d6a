"""The dashboards' screenshots join the site without a copy in ``docs/``.

An MkDocs hook (``hooks:`` in ``mkdocs.yml``): every PNG in ``dashboards/screenshots/`` (kept beside the dashboards
it shows) is added to the build as ``assets/screenshots/NAME``, so a page shows it with
``![…](../assets/screenshots/NAME)`` and the strict build checks the link.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

SCREENSHOTS = Path("dashboards") / "screenshots"


def on_files(files: Files, *, config: MkDocsConfig) -> Files:
    root = Path(config.config_file_path).parent / SCREENSHOTS
    for path in sorted(root.glob("*.png")):
        files.append(File.generated(config, f"assets/screenshots/{path.name}", abs_src_path=str(path)))
    return files
