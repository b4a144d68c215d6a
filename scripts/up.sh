#!/usr/bin/env bash
# The main job: sets everything up on a fresh machine, then runs the whole stack locally on the embedded
# defaults (simulated Kimi K3 + DSpark workers, gateway, controller) until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/gearshift up "$@"
