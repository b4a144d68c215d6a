# Prometheus from Debian's package, for a host that cannot pull prom/prometheus (scripts/compose-check.sh). Laid
# out like the official image: the binary is the entrypoint, the compose service passes the flags, and the
# TSDB lives in /prometheus (the working directory).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
WORKDIR /prometheus
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
