# recmesh accelerator: runs the dense network through a PJRT plugin that it
# dlopens, so it is built with cgo and runs on a glibc base. The plugin comes
# from its PyPI wheel; the PJRT build argument picks which:
#
#   cpu   (default) xla-cpu-pjrt   -> /opt/pjrt/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so
#   cuda            xla-cuda13-pjrt -> /opt/pjrt/xla_plugins/xla_cuda13_pjrt/xla_gpu_pjrt.so
#                   (PJRT C API 0.81, the binding's: JAX's own jax-cuda13-pjrt
#                   speaks a newer API the binding cannot drive, docs/gpu.md)
#                   with the CUDA 13 libraries from NVIDIA's wheels beside it
#                   (the plugin's RUNPATH finds them under /opt/pjrt/nvidia);
#                   the driver comes from the host (NVIDIA container toolkit).
#
# Build from the repository root (the build context is the Go workspace):
#   docker build -f deploy/docker/accelerator.Dockerfile -t recmesh/accelerator:dev .
#   docker build -f deploy/docker/accelerator.Dockerfile --build-arg PJRT=cuda \
#       -t recmesh/accelerator:dev-cuda .
#
# The classic builder (an engine without buildx) runs every stage up to its
# target in file order, needed or not, so the CPU image's stages come first
# and CUDA's after them: build with --target accelerator-cpu (compose does)
# or --target accelerator-cuda there, and the other plugin is never fetched.

ARG GO_IMAGE=golang:1.26-bookworm
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
ARG PJRT=cpu

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

FROM ${PYTHON_IMAGE} AS pjrt-cpu
RUN pip install --no-cache-dir --disable-pip-version-check --target /opt/pjrt xla-cpu-pjrt==0.0.1 \
    && test -f /opt/pjrt/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so

FROM ${RUNTIME_IMAGE} AS runtime
# The same uid as distroless "nonroot" in the frontend image, so the three
# processes can all map the segment files in the shared /dev/shm.
RUN groupadd --system --gid 65532 nonroot \
    && useradd --system --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home \
       --shell /usr/sbin/nologin nonroot
COPY --from=build /out/accelerator /out/recmesh /usr/local/bin/
USER 65532:65532
# The binaries bind /metrics and /healthz to 127.0.0.1 by default; in a
# container they listen on every interface, for Prometheus and probes.
ENV RECMESH_BUNDLE=/data/dlrm-cap1000 \
    RECMESH_SHM_DIR=/dev/shm \
    RECMESH_METRICS_ADDR=:9103 \
    OTEL_SERVICE_NAME=recmesh-accelerator
EXPOSE 9103
# Start-up compiles the XLA programs for every batch bucket: give it time.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["/usr/local/bin/recmesh", "health", "--http", "http://127.0.0.1:9103/readyz"]
ENTRYPOINT ["/usr/local/bin/accelerator"]
CMD ["serve"]

FROM runtime AS accelerator-cpu
COPY --from=pjrt-cpu /opt/pjrt /opt/pjrt
ENV RECMESH_PJRT_PLUGIN=/opt/pjrt/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so

FROM ${PYTHON_IMAGE} AS pjrt-cuda
# jax-cuda13-plugin is installed only for its with-cuda extra, which pins the
# CUDA 13 library wheels (cuBLAS, cuDNN, CUPTI, NVRTC, the runtime) into
# nvidia/cu13/lib and nvidia/cudnn/lib, where xla_gpu_pjrt.so's RUNPATH
# looks.
RUN pip install --no-cache-dir --disable-pip-version-check --target /opt/pjrt \
       xla-cuda13-pjrt==0.0.1 "jax-cuda13-plugin[with-cuda]==0.12.0.1" \
    && test -f /opt/pjrt/xla_plugins/xla_cuda13_pjrt/xla_gpu_pjrt.so

FROM runtime AS accelerator-cuda
COPY --from=pjrt-cuda /opt/pjrt /opt/pjrt
# Which GPUs the container sees is the runtime's to say (compose's device
# reservation, Kubernetes' nvidia.com/gpu limit), not the image's.
ENV RECMESH_PJRT_PLUGIN=/opt/pjrt/xla_plugins/xla_cuda13_pjrt/xla_gpu_pjrt.so \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# The image: the runtime with the plugin that PJRT names (a stage of this
# file, not a registry image, so it has no tag).
# hadolint ignore=DL3006
FROM accelerator-${PJRT}
