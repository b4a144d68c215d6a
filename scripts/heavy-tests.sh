#!/usr/bin/env bash
# The heavy checks kept out of the default test run (pytest -m heavy): sets up like scripts/test.sh, then runs
# only the tests marked heavy (real vLLM drain/restart, prefix affinity on two CPU vLLM workers, the controller on
# a Redis Cluster losing a master, the compose deployment in Docker, the console in Chromium, the chaos bench's
# fast subset). Extra arguments go to pytest.
#
# --timeout: each test's limit (seconds, its fixtures' setup included) unless its own timeout mark says otherwise;
# a vLLM start takes 20-30 s on 2 idle cores and minutes on a loaded machine, the compose check builds images on a
# fresh one. --durations=0: every test's time, for the CI log. -ra (pyproject) names every skip and its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/vllm-env.sh
export PATH="$PWD/.venv/bin:$PATH"
exec pytest -m heavy --timeout=900 --durations=0 "$@"
