# recmesh embedder: holds the embedding tables, owns the shared-memory
# segment. Static Go binaries (no cgo) on Debian slim, which also gives the
# bundle exporter step (compose's "bundle" service, the Kubernetes init
# container) the shell it runs under. Runs as a non-root user.
#
# Build from the repository root (the build context is the Go workspace):
#   docker build -f deploy/docker/embedder.Dockerfile -t recmesh/embedder:dev .

ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${GO_IMAGE} AS build
WORKDIR /src
ENV GOFLAGS=-buildvcs=false
COPY . .
# This build stage is the same, byte for byte, in the three recmesh
# Dockerfiles (deploy/dockerfile_test.go checks it): builders cache a step by
# its text and inputs, so the second and third image reuse the binaries the
# first one built. The accelerator needs cgo (it dlopens the PJRT plugin);
# the others are static.
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cli/cmd/recmesh ./embedder/cmd/embedder ./frontend/cmd/frontend \
    && CGO_ENABLED=1 go build -trimpath -ldflags="-s -w" -o /out/ ./accelerator/cmd/accelerator

FROM ${RUNTIME_IMAGE}
# The same uid as distroless "nonroot" in the frontend image. /data is where
# the bundle volume mounts, /nats/* the control plane's identity volumes
# (recmesh nats-identities): a new named volume takes the owner of the
# directory it first mounts on.
RUN groupadd --system --gid 65532 nonroot \
    && useradd --system --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home \
       --shell /usr/sbin/nologin nonroot \
    && mkdir -p /data /nats/server /nats/embedder /nats/accelerator /nats/frontend /nats/trainer /nats/admin \
    && chown 65532:65532 /data /nats/server /nats/embedder /nats/accelerator /nats/frontend /nats/trainer /nats/admin
COPY --from=build /out/embedder /out/recmesh /usr/local/bin/
USER 65532:65532
# The binaries bind /metrics and /healthz to 127.0.0.1 by default; in a
# container they listen on every interface, for Prometheus and probes.
ENV RECMESH_BUNDLE=/data/dlrm-cap1000 \
    RECMESH_SHM_DIR=/dev/shm \
    RECMESH_METRICS_ADDR=:9102 \
    OTEL_SERVICE_NAME=recmesh-embedder
EXPOSE 9102
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["/usr/local/bin/recmesh", "health", "--http", "http://127.0.0.1:9102/readyz"]
ENTRYPOINT ["/usr/local/bin/embedder"]
