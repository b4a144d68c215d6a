#!/usr/bin/env bash
# The test command: sets everything up on a fresh machine, then runs lint, types, layer contracts, the docs site's
# strict build and the whole test suite (integration tests start their own redis-server, simulated workers, vLLM,
# Prometheus).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/vllm-env.sh   # the real vLLM CPU engine for tests/vllm, in its own .venv-vllm (minutes once)
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff";        ruff check .; ruff format --check .   # two commands: under set -e a failing left side of && would not stop the run
echo "== mypy";        mypy
echo "== import-linter"; lint-imports
echo "== mkdocs";      NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet   # the docs site: a broken link fails
echo "== pytest";      pytest "$@"
