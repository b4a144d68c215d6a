# The Python base of gearshift's image built from Debian's packages alone, with no registry pull
# (scripts/compose-check.sh). DEBIAN is a local image of Debian itself (debootstrap, then docker import); the
# build context's ca/ holds the site's extra CA certificates (a TLS-intercepting egress), trusted by apt and pip.
ARG DEBIAN=debian:bookworm-slim
FROM ${DEBIAN}
ENV DEBIAN_FRONTEND=noninteractive
COPY ca/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
 && update-ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
