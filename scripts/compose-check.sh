#!/usr/bin/env bash
# Build and run the compose deployment (deploy/compose/compose.yaml) in Docker without pulling any image from a
# registry, drive it, fail a controller over, and tear it all down. Its own command, not in the default tests
# (tests/deploy/test_deploy_compose_docker.py, marked heavy, runs it). Needs root.
#
#   scripts/compose-check.sh [--requests N] [--rebuild] [--build-only]
#
# Steps 1-3 run under one lock (/var/tmp/gearshift-compose-check.lock: the images are the host's, whatever the work
# folder): --build-only does just them, and a run that finds the lock taken waits for it, then finds the images
# made. scripts/heavy-tests.sh starts a --build-only run in the background, so this I/O-bound build (apt, debootstrap,
# pip: mostly downloads) overlaps the CPU-bound heavy checks instead of adding to them.
#
# 1. Tools from Debian: docker.io and debootstrap (apt), and Compose v2 — Debian's docker-compose package of the
#    next release (bookworm's is the Python 1.29) fetched through a scratch apt configuration, the system's apt
#    sources left alone. dockerd is started if none answers (and stopped at the end).
# 2. The base image: debootstrap of this machine's Debian suite from its apt mirror, then `docker import`; on it
#    deploy/docker/base.Dockerfile (Python, and the host's extra CA certificates for pip behind a TLS-intercepting
#    egress), redis.Dockerfile and prometheus.Dockerfile from Debian's packages. Kept between runs (--rebuild
#    makes them again).
# 3. gearshift's image from that base (deploy/docker/Dockerfile, BASE build argument; Python packages from PyPI).
# 4. The stack's own services up with fresh secrets (scripts/compose-env.sh): Redis, two gateways, two
#    controllers, two simulated workers, Prometheus; Grafana and the OpenTelemetry collector are in the
#    `observability` profile and not run here. Published ports are moved to free ports on 127.0.0.1.
# 5. bench/compose_check.py: openai-client traffic through both gateways, a run-time tenant across them, the
#    leader controller killed and the standby's takeover; then Prometheus is asked whether it scraped every part.
# 6. `docker compose down -v` (always, on exit).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
requests=40
rebuild=0
build_only=0
while (($#)); do
  case "$1" in
    --requests) requests="$2"; shift 2 ;;
    --rebuild) rebuild=1; shift ;;
    --build-only) build_only=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $(id -u) == 0 ]] || { echo "compose-check: run as root (apt-get, dockerd, debootstrap)" >&2; exit 2; }
work="${GEARSHIFT_COMPOSE_WORK:-/var/tmp/gearshift-compose}"
mkdir -p "$work"
started=$SECONDS
phase() { printf '[compose-check %s %4ds] %s\n' "$(date -u +%H:%M:%S)" $((SECONDS - started)) "$*"; }
our_dockerd=""
stop_dockerd() {
  if [[ -n "$our_dockerd" ]]; then kill "$our_dockerd"; wait "$our_dockerd" 2>/dev/null || true; our_dockerd=""; fi
}
trap stop_dockerd EXIT

# One build at a time (fd 9 holds the lock until the build steps are done; in --build-only mode until the exit, after
# the dockerd it started is stopped, so a waiting run never meets a dockerd that is going away).
exec 9>/var/tmp/gearshift-compose-check.lock
if ! flock -n 9; then
  phase "waiting for the build that another compose-check holds (/var/tmp/gearshift-compose-check.lock)"
  flock 9
fi

# ------------------------------------------------------------------------------------------------ 1. tools
. /etc/os-release
suite="$VERSION_CODENAME"
mirror="$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
  grep -oP '^(URIs:\s*|deb\s+)\Khttps?://\S+/debian(?=\s|$)' | head -1 || true)"
mirror="${mirror:-http://deb.debian.org/debian}"
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  phase "installing docker.io and debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi
if ! docker compose version >/dev/null 2>&1; then
  phase "installing Compose v2 (Debian trixie's docker-compose package)"
  apt_dir="$work/apt-trixie"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb $mirror trixie main" >"$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
  apt-get "${apt_opts[@]}" update -qq
  (cd "$apt_dir" && apt-get "${apt_opts[@]}" download docker-compose 2>/dev/null && dpkg -i docker-compose_*.deb >/dev/null)
fi
if ! docker info >/dev/null 2>&1; then
  phase "starting dockerd (log: $work/dockerd.log)"
  dockerd >"$work/dockerd.log" 2>&1 9>&- &  # without the lock's fd: it must not hold the lock
  our_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null
fi

# --------------------------------------------------------------------------------------------- 2. base images
debian="gearshift-debian:$suite"
image_missing() { ((rebuild)) || ! docker image inspect "$1" >/dev/null 2>&1; }
if image_missing "$debian"; then
  phase "debootstrap $suite from $mirror, then docker import as $debian"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log"
  tar -C "$work/rootfs" -c . | docker import - "$debian" >/dev/null
  rm -rf "$work/rootfs"
fi
legacy_build() { DOCKER_BUILDKIT=0 docker build -q "$@" >/dev/null; }
base="gearshift-base:$suite"
if image_missing "$base"; then
  phase "building $base (Python from Debian, the host's extra CA certificates)"
  context="$(mktemp -d)"
  mkdir "$context/ca"
  cp /usr/local/share/ca-certificates/*.crt "$context/ca/" 2>/dev/null || true
  cp "$root/deploy/docker/base.Dockerfile" "$context/Dockerfile"
  legacy_build --build-arg "DEBIAN=$debian" -t "$base" "$context"
  rm -rf "$context"
fi
for service in redis prometheus; do
  if image_missing "gearshift-$service:$suite"; then
    phase "building gearshift-$service:$suite from Debian's package"
    legacy_build -f "$root/deploy/docker/$service.Dockerfile" --build-arg "BASE=$debian" -t "gearshift-$service:$suite" \
      "$root/deploy/docker"
  fi
done

# ----------------------------------------------------------------------------------------- 3. gearshift image
export GEARSHIFT_BASE_IMAGE="$base" GEARSHIFT_REDIS_IMAGE="gearshift-redis:$suite"
export GEARSHIFT_PROMETHEUS_IMAGE="gearshift-prometheus:$suite"
run="$(mktemp -d)"
bash "$root/scripts/compose-env.sh" "$run/.env" >/dev/null
free_port() { "$root/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
gw1=$(free_port) gw2=$(free_port) prom=$(free_port)
cat >"$run/ports.yaml" <<YAML
# Published on loopback only, on free ports (the check's traffic goes to 127.0.0.1 alone).
services:
  gateway-1: {ports: !override ["127.0.0.1:$gw1:8080"]}
  gateway-2: {ports: !override ["127.0.0.1:$gw2:8080"]}
  prometheus: {ports: !override ["127.0.0.1:$prom:9090"]}
YAML
compose=(docker compose -p "gearshift-check-$$" --env-file "$run/.env" -f "$root/deploy/compose/compose.yaml" -f "$run/ports.yaml")
stack_started=0
cleanup() {
  if ((stack_started)); then
    phase "tearing down"
    "${compose[@]}" down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
  fi
  rm -rf "$run"
  stop_dockerd
  phase "done"
}
trap cleanup EXIT
phase "building gearshift:dev on $base"
"${compose[@]}" build --quiet sim-0  # every gearshift service shares this image
if ((build_only)); then
  phase "built (--build-only)"
  exit 0
fi
exec 9>&-  # the build is done: the lock is free for another run

# ------------------------------------------------------------------------------------------------ 4. stack up
stack_started=1
phase "starting the stack (Redis, 2 gateways, 2 controllers, 2 simulated workers, Prometheus)"
if ! "${compose[@]}" up -d --no-build --wait --wait-timeout 240 >"$run/up.log" 2>&1; then
  cat "$run/up.log" >&2
  "${compose[@]}" ps -a >&2
  "${compose[@]}" logs --tail 40 >&2
  exit 1
fi
"${compose[@]}" ps --format '{{.Service}}: {{.Status}}'

# ------------------------------------------------------------------------------------------ 5. drive, fail over
phase "driving traffic, a run-time tenant, and the controller failover"
admin_key="$(grep -oP '^GEARSHIFT_ADMIN_KEY=\K.*' "$run/.env")"
status=0
(cd "$root" && .venv/bin/python -m bench.compose_check --gateway "http://127.0.0.1:$gw1" \
  --gateway "http://127.0.0.1:$gw2" --admin-key "$admin_key" --requests "$requests" -- "${compose[@]}") || status=1
phase "asking Prometheus what it scraped"
"$root/.venv/bin/python" - "http://127.0.0.1:$prom" <<'PY' || status=1
import json, sys, time, urllib.request
url, jobs = sys.argv[1], {"gearshift-gateway", "gearshift-controller", "gearshift-worker"}
for _ in range(60):  # a scrape every 5 s: the first ones may still be pending
    targets = json.load(urllib.request.urlopen(f"{url}/api/v1/targets", timeout=5))["data"]["activeTargets"]
    up = {t["labels"]["job"] for t in targets if t["health"] == "up"}
    if jobs <= up:
        break
    time.sleep(1)
print(json.dumps({"prometheus_jobs_up": sorted(up)}))
sys.exit(0 if jobs <= up else 1)
PY
if ((status)); then
  "${compose[@]}" logs --tail 30 >&2
  phase "FAILED"
  exit 1
fi
phase "passed"
