# compose: the mesh's images and docker compose, for real (docs/deployment.md).
#
#   make compose-tools   Compose v2 (the docker compose plugin), nats-server and
#                        Jaeger, built from their Go modules into .deps/compose
#   make images          the frontend, embedder and accelerator images, after
#                        making sure every base image exists: pulled, or built
#                        locally (debootstrap) where no registry answers
#   make compose-test    compose.yaml under docker compose: scaled, killed,
#                        traced, torn down; ends with the `compose ok:` line
#
# A Docker Engine must answer, or be startable: as root, with Debian's
# docker.io installed, these targets start dockerd themselves and
# compose-test stops it again afterwards (deploy/local/engine.sh).
#
# Included by the root Makefile; CI runs compose-test.

COMPOSE_DIR      := $(DEPS)/compose
COMPOSE_TOOLS    := $(COMPOSE_DIR)/bin
COMPOSE_BIN      := $(COMPOSE_TOOLS)/docker-compose
# Pinned: Compose v5.6.0 is the newest that builds with Go 1.26.8; Jaeger's
# module v1.73.0 is Jaeger 2.10.0, the image compose.yaml names; nats-server
# 2.12 is the line of compose.yaml's nats:2.12-alpine.
COMPOSE_VERSION  := v5.6.0
JAEGER_MODULE    := v1.73.0
NATS_VERSION     := v2.12.1
# Where no registry answers, the build steps that fetch (Go modules, the PJRT
# wheel) run in the host's network: see deploy/local/compose.build.yaml.
IMAGES_COMPOSE   := $(COMPOSE_BIN) -f compose.yaml -f deploy/local/compose.build.yaml
COMPOSE_SERVICES_BUILT := mesh accelerator frontend

.PHONY: compose-tools compose-engine images compose-test compose-down

compose-tools: $(COMPOSE_BIN) $(COMPOSE_TOOLS)/nats-server $(COMPOSE_TOOLS)/jaeger

$(COMPOSE_BIN):
	deploy/local/build-tool.sh github.com/docker/compose/v5 $(COMPOSE_VERSION) ./cmd $@ \
		"-X github.com/docker/compose/v5/internal.Version=$(COMPOSE_VERSION)"

$(COMPOSE_TOOLS)/nats-server:
	deploy/local/build-tool.sh github.com/nats-io/nats-server/v2 $(NATS_VERSION) . $@

$(COMPOSE_TOOLS)/jaeger:
	deploy/local/build-tool.sh github.com/jaegertracing/jaeger $(JAEGER_MODULE) ./cmd/jaeger $@

compose-engine:
	deploy/local/engine.sh start $(COMPOSE_DIR)

## images: base images first (kept when present), then the mesh's own, with
## the real compose.yaml build definitions. Idempotent; the builder's layer
## cache makes a rebuild of unchanged sources quick.
images: compose-tools compose-engine
	deploy/local/base-images.sh $(COMPOSE_TOOLS) $(COMPOSE_DIR)/work
	$(IMAGES_COMPOSE) build $(COMPOSE_SERVICES_BUILT) > $(COMPOSE_DIR)/build.log 2>&1 || { tail -n 40 $(COMPOSE_DIR)/build.log; echo "images: failed (whole log in .deps/compose/build.log)"; exit 1; }
	@docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^recmesh/'

# eBPF steering where this machine and engine allow it, the kernel's hash
# otherwise (deploy/local/steering-mode.sh says why); COMPOSE_STEERING=…
# forces one. The test checks every frontend reports the mode expected.
COMPOSE_STEERING ?=

## compose-test: the engine stays up only if it was running before.
compose-test: deps images
	@rc=0; steering=$(COMPOSE_STEERING); [ -n "$$steering" ] || steering=$$(deploy/local/steering-mode.sh); \
	files=compose.yaml; [ "$$steering" = ebpf ] && files=compose.yaml:deploy/compose.ebpf.yaml; \
	echo "compose-test: steering $$steering, files $$files"; \
	RECMESH_COMPOSE_TEST=1 RECMESH_COMPOSE="$(COMPOSE_BIN)" RECMESH_COMPOSE_FILES="$$files" RECMESH_COMPOSE_STEERING=$$steering \
		$(GO) test -count=1 -timeout 40m -run '^TestCompose$$' -v ./cli/e2e/ > $(COMPOSE_DIR)/compose-test.log 2>&1 || rc=$$?; \
	deploy/local/engine.sh stop $(COMPOSE_DIR); \
	if [ $$rc != 0 ]; then tail -n 80 $(COMPOSE_DIR)/compose-test.log; echo "compose-test: failed (whole log in .deps/compose/compose-test.log)"; exit 1; fi
	@grep -E '^\s*(--- |compose_test.go:[0-9]+: )' $(COMPOSE_DIR)/compose-test.log || true
	@grep '^compose: ' $(COMPOSE_DIR)/compose-test.log || true
	@grep '^compose ok:' $(COMPOSE_DIR)/compose-test.log

## compose-down: remove what an interrupted compose-test left.
compose-down:
	COMPOSE_PROJECT_NAME=recmesh-test $(COMPOSE_BIN) -f compose.yaml down --volumes --remove-orphans --timeout 30
