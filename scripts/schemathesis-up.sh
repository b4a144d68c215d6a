#!/usr/bin/env bash
# Fuzz a running `gearshift up` from the gateway's own OpenAPI document with schemathesis: every operation, each
# with the key its security scheme names — a tenant key (apiKey; default: the embedded demo tenant's) and the
# admin key (adminKey; default: the development one). Fails on any server error or schema violation.
#
#   scripts/schemathesis-up.sh [GATEWAY_URL] [schemathesis run options…]
#   GEARSHIFT_TENANT_KEY=… GEARSHIFT_ADMIN_KEY=… scripts/schemathesis-up.sh http://127.0.0.1:8080 --max-examples 200
set -euo pipefail
url="${1:-http://127.0.0.1:8080}"
shift $(($# > 0 ? 1 : 0))
export GEARSHIFT_TENANT_KEY="${GEARSHIFT_TENANT_KEY:-gs-demo-key}"
export GEARSHIFT_ADMIN_KEY="${GEARSHIFT_ADMIN_KEY:-gearshift-dev-admin}"
config="$(mktemp --suffix .toml)"
trap 'rm -f "$config"' EXIT
cat >"$config" <<'TOML'
[cache]
enabled = false

[auth.openapi.apiKey]
bearer = "${GEARSHIFT_TENANT_KEY}"

[auth.openapi.adminKey]
bearer = "${GEARSHIFT_ADMIN_KEY}"
TOML
schemathesis="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/schemathesis"
"$schemathesis" --config-file "$config" run "$url/openapi.json" \
  --checks not_a_server_error,response_schema_conformance --request-timeout 60 "$@"
