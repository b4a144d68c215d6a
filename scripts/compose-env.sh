#!/usr/bin/env bash
# First run of the compose deployment: write deploy/compose/.env (or the file given as $1) with fresh secrets —
# the pepper of the API-key digests, the admin API key and the workers' control token. Docker Compose reads
# the .env beside compose.yaml; without it the stack refuses to start. An existing file is kept: its secrets
# are the deployment's (a new pepper invalidates every API key issued under the old one).
set -euo pipefail
env_file="${1:-$(cd "$(dirname "$0")/.." && pwd)/deploy/compose/.env}"
if [[ -e "$env_file" ]]; then
  echo "kept $env_file (delete it to generate new secrets)"
  exit 0
fi
secret() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
umask 077
cat >"$env_file" <<ENV
# Written by scripts/compose-env.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ). Keep it secret; do not commit it.
GEARSHIFT_KEY_PEPPER=$(secret)
GEARSHIFT_ADMIN_KEY=gs-admin-$(secret)
GEARSHIFT_CONTROL_TOKEN=$(secret)
ENV
echo "wrote $env_file"
echo "API keys are issued with the admin key once the stack is up:"
echo "  curl -s localhost:8080/admin/v1/keys -H \"Authorization: Bearer \$GEARSHIFT_ADMIN_KEY\" -d '{\"tenant\": \"demo\"}'"
