#!/usr/bin/env bash
# Regenerates the console's screenshots in docs/operations/console/ (one per page): runs the console's browser
# test (Playwright driving Debian's Chromium against `gearshift up`), which saves each page it visits there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
CONSOLE_SCREENSHOTS_DIR="$PWD/docs/operations/console" exec pytest -q -m heavy tests/console/test_console_browser.py "$@"
