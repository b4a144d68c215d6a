#!/usr/bin/env bash
# The heavy checks kept out of the default test run (pytest -m heavy): sets up like scripts/test.sh, then runs
# only the tests marked heavy (real vLLM drain/restart, prefix affinity on two CPU vLLM workers, the controller on
# a Redis Cluster losing a master, the compose deployment in Docker, the console in Chromium, the chaos bench's
# fast subset). Extra arguments go to pytest.
#
# The whole set (no arguments, as .ci/run runs it) as root: the compose check's images are built in the background
# (scripts/compose-check.sh --build-only, niced: apt, debootstrap and pip, mostly downloads) while the CPU-bound
# checks run. tests/conftest.py orders the set: the real-vLLM checks first (they bear a busy core best: long
# start-up limits, no timing asserted), the compose check last; its own scripts/compose-check.sh waits for the
# background build and finds the images made. The build's log is printed at the end.
#
# --timeout: each test's limit (seconds, its fixtures' setup included) unless its own timeout mark says otherwise;
# a vLLM start takes 20-30 s on 2 idle cores and minutes on a loaded machine, the compose check builds images on a
# fresh one. --durations=0: every test's time, for the CI log. -ra (pyproject) names every skip and its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/vllm-env.sh
export PATH="$PWD/.venv/bin:$PATH"

prebuild=""
prebuild_log="${GEARSHIFT_COMPOSE_WORK:-/var/tmp/gearshift-compose}/prebuild.log"
if (($# == 0)) && [[ $(id -u) == 0 ]]; then
  mkdir -p "$(dirname "$prebuild_log")"
  echo "heavy-tests: building the compose check's images in the background (log: $prebuild_log)"
  nice -n 10 bash scripts/compose-check.sh --build-only </dev/null >"$prebuild_log" 2>&1 &
  prebuild=$!
fi
status=0
pytest -m heavy --timeout=900 --durations=0 "$@" || status=$?
if [[ -n "$prebuild" ]]; then
  prebuilt=0
  wait "$prebuild" || prebuilt=$?
  echo "heavy-tests: the background compose build exited $prebuilt; its log ($prebuild_log):"
  cat "$prebuild_log"
fi
exit "$status"
