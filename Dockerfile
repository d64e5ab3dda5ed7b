# One image for both sidecars and for agent workers built on the clients:
#   docker run IMAGE seedstore serve --listen unix:///sockets/seedstore.sock
#   docker run IMAGE negotiator serve --listen unix:///sockets/negotiator.sock
#   docker run IMAGE agentsidecar-health-probe -addr unix:///sockets/seedstore.sock
# Any installed command runs as given (there is no dispatcher): tini is the
# entrypoint so SIGTERM reaches the sidecar and the evidence processes the
# seedstore's verification spawns are reaped. Probes live in compose/k8s.

# The Debian release is part of the tag so the apt pin below stays valid.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SKILLSPEC_HOME=/data/skillspec

RUN apt-get update \
 && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
 && rm -rf /var/lib/apt/lists/*

# A fixed numeric uid/gid: Kubernetes runAsNonRoot can check it, and named
# volumes first mounted on /sockets, /data/skillspec and /data/negotiator (the
# negotiator's --state-dir) inherit this ownership.
RUN groupadd --system --gid 10001 sidecar \
 && useradd --system --uid 10001 --gid sidecar --home-dir /home/sidecar --create-home \
      --shell /usr/sbin/nologin sidecar \
 && mkdir -p /sockets /data/skillspec /data/negotiator \
 && chown sidecar:sidecar /sockets /data/skillspec /data/negotiator

WORKDIR /build
COPY pyproject.toml README.md hatch_build.py agentsidecar_pair.py ./
COPY protos/ protos/
COPY sidecar_runtime/ sidecar_runtime/
COPY clients/ clients/
COPY seedstore_service/ seedstore_service/
COPY negotiator_service/ negotiator_service/
# The build hook compiles the protos here; grpcio-tools only lives in pip's
# throwaway build environment, and the sources go once the wheel is installed.
# With the `otel` extra, so `--otel` can export spans from the image as it is.
RUN pip install --no-cache-dir "./[otel]" \
 && rm -rf /build

# Example workers run from here (`python -m examples.agent ...`); the
# examples are not part of the wheel.
WORKDIR /app
COPY examples/ examples/

USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["agentsidecar-pair", "--run-dir", "/sockets"]
