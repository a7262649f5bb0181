# recmesh frontend: the Open Inference Protocol v2 gRPC server. Static Go
# binaries (no cgo) on a distroless base, running as a non-root user.
#
# Build from the repository root (the build context is the Go workspace):
#   docker build -f deploy/docker/frontend.Dockerfile -t recmesh/frontend:dev .

ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

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
COPY --from=build /out/frontend /out/recmesh /usr/local/bin/
# Every recmesh image runs as 65532 (distroless "nonroot"), so the segment
# one process creates in the shared /dev/shm is the others' to attach to;
# compose.yaml runs the frontends as 65533 in the group 65532 instead
# (docs/security.md, "Frontends as another user").
USER 65532:65532
# RECMESH_METRICS_ADDR is a range: replicas that share one network namespace
# (compose --scale) each bind the first free port in it. The binary's default
# is 127.0.0.1; in a container it listens on every interface, for Prometheus.
ENV RECMESH_PORT=8001 \
    RECMESH_METRICS_ADDR=:9110-9125 \
    RECMESH_SHM_DIR=/dev/shm \
    OTEL_SERVICE_NAME=recmesh-frontend
EXPOSE 8001
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/recmesh", "health", "--grpc", "127.0.0.1:8001"]
ENTRYPOINT ["/usr/local/bin/frontend"]
