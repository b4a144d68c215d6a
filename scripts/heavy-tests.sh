#!/usr/bin/env bash
# The heavy checks kept out of the default test run (pytest -m heavy): sets up like scripts/test.sh, then runs
# only the tests marked heavy (real vLLM drain/restart and the like). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/vllm-env.sh
export PATH="$PWD/.venv/bin:$PATH"
exec pytest -m heavy "$@"
