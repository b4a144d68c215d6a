# Redis from Debian's package, for a host that cannot pull redis:7.4-alpine (scripts/compose-check.sh). The
# compose service's command runs it: `redis-server --appendonly yes …` in /data, the official image's layout.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server redis-tools \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server"]
