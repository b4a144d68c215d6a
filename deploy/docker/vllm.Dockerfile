# syntax=docker/dockerfile:1
# A vLLM worker image with the gearshift plugin. Build from the repository root:
#   docker build -f deploy/docker/vllm.Dockerfile -t gearshift-vllm:dev .
#
# Two environments, so gearshift's pins never move vLLM's:
# - vLLM's own Python gets gearshift without dependencies plus the two packages the plugin imports
#   (the same PLUGIN_REQUIREMENTS as scripts/vllm-env.sh): this registers the vllm.general_plugins and
#   vllm.endpoint_plugins entry points the engine loads when VLLM_PLUGINS names gearshift;
# - /opt/gearshift holds the full `gearshift` CLI, whose `gearshift worker vllm` builds the vLLM command line
#   from the fleet file and execs vLLM's `vllm serve` with the plugin enabled.
FROM vllm/vllm-openai:v0.32.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/gearshift-src
COPY pyproject.toml README.md ./
COPY fleet/ fleet/
COPY workers/ workers/
COPY controller/ controller/
COPY gateway/ gateway/
COPY bench/ bench/
COPY gearshift/ gearshift/
RUN python3 -m pip install --no-deps . \
 && python3 -m pip install pydantic-settings==2.14.1 PyYAML==6.0.3 \
 && python3 -m venv /opt/gearshift \
 && /opt/gearshift/bin/pip install .
# An absolute entrypoint: vLLM's environment has a `gearshift` script too (from the no-deps install), and the
# launcher must be the full one. /opt/gearshift/bin stays off PATH, so the launcher's exec finds vLLM's `vllm`.
ENTRYPOINT ["/opt/gearshift/bin/gearshift"]
CMD ["worker", "vllm", "--help"]
