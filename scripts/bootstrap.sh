#!/usr/bin/env bash
# Installs everything gearshift needs on a fresh Debian machine: system packages (redis-server, …) and the
# project's virtualenv (.venv) with pinned dependencies. Idempotent and quiet when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(redis-server wrk prometheus chromium)  # chromium: the console's browser test (Playwright)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The Debian packages start system-wide services; gearshift starts its own on loopback when it needs them.
  for svc in redis-server prometheus; do $SUDO service "$svc" stop >/dev/null 2>&1 || true; done
fi

PYTHON=${PYTHON:-python3}
EXTRAS=dev,bench  # tests and tools, and the evaluation lab (plots, fits, fuzzing, profiling)
stamp=.venv/.gearshift-installed
want=$( (cat pyproject.toml; echo "$EXTRAS") | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing the Python environment into .venv"
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/pip install -q --disable-pip-version-check -e ".[$EXTRAS]"
  echo "$want" >"$stamp"
fi
