# proto.mk — regenerate the checked-in Go code of proto/ from its .proto
# sources, with tools that come from registries only and are pinned here:
#
#   protoc              the one bundled in the PyPI package grpcio-tools,
#                       installed into its own venv under $(DEPS)
#   protoc-gen-go       google.golang.org/protobuf, via `go install`
#   protoc-gen-go-grpc  google.golang.org/grpc/cmd/protoc-gen-go-grpc, via `go install`
#
#   make proto        regenerate proto/**/*.pb.go
#   make proto-check  fail if the checked-in code differs from a fresh generation
#
# Included by the root Makefile, which defines ROOT, DEPS, GO and PYTHON.
# Bumping a version below reinstalls that tool (the stamps carry versions).

GRPCIO_TOOLS_VERSION       := 1.85.1
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

PROTO_DIR     := $(ROOT)/proto
PROTO_MODULE  := github.com/recmesh/recmesh/proto
PROTO_SRCS    := $(shell cd $(PROTO_DIR) && find . -name '*.proto' -not -path './.*' | sed 's|^\./||' | sort)
PROTOC_VENV   := $(DEPS)/protoc-venv
PROTOC_STAMP  := $(PROTOC_VENV)/.grpcio-tools-$(GRPCIO_TOOLS_VERSION)
PROTO_BIN     := $(DEPS)/bin
GEN_GO        := $(PROTO_BIN)/protoc-gen-go
GEN_GO_GRPC   := $(PROTO_BIN)/protoc-gen-go-grpc
GEN_GO_STAMP      := $(PROTO_BIN)/.protoc-gen-go-$(PROTOC_GEN_GO_VERSION)
GEN_GO_GRPC_STAMP := $(PROTO_BIN)/.protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)

# protoc_gen OUT: generate every .proto into the directory OUT (laid out by
# Go package path below the module, i.e. like proto/ itself).
define protoc_gen
	cd $(PROTO_DIR) && $(PROTOC_VENV)/bin/python -m grpc_tools.protoc \
		-I . \
		--plugin=protoc-gen-go=$(GEN_GO) \
		--plugin=protoc-gen-go-grpc=$(GEN_GO_GRPC) \
		--go_out=$(1) --go_opt=module=$(PROTO_MODULE) \
		--go-grpc_out=$(1) --go-grpc_opt=module=$(PROTO_MODULE) \
		$(PROTO_SRCS)
endef

.PHONY: proto proto-check proto-tools

proto-tools: $(PROTOC_STAMP) $(GEN_GO_STAMP) $(GEN_GO_GRPC_STAMP)

proto: proto-tools
	$(call protoc_gen,$(PROTO_DIR))

# Generates into a scratch directory and compares with what is checked in, so
# a stale .pb.go (an edited .proto, a bumped generator) fails loudly.
proto-check: proto-tools
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(call protoc_gen,$$tmp) && \
	status=0 && \
	for f in $$(cd "$$tmp" && find . -name '*.pb.go' | sort); do \
		cmp -s "$$tmp/$$f" "$(PROTO_DIR)/$$f" || { echo "proto-check: proto/$${f#./} is stale; run make proto" >&2; status=1; }; \
	done && \
	for f in $$(cd $(PROTO_DIR) && find . -name '*.pb.go' | sort); do \
		test -f "$$tmp/$$f" || { echo "proto-check: proto/$${f#./} has no .proto source" >&2; status=1; }; \
	done && \
	exit $$status

$(PROTOC_STAMP):
	rm -rf $(PROTOC_VENV)
	$(PYTHON) -m venv $(PROTOC_VENV)
	$(PROTOC_VENV)/bin/python -m pip install --quiet --disable-pip-version-check grpcio-tools==$(GRPCIO_TOOLS_VERSION)
	@touch $@

$(GEN_GO_STAMP):
	@mkdir -p $(PROTO_BIN)
	GOBIN=$(PROTO_BIN) GOWORK=off $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@rm -f $(PROTO_BIN)/.protoc-gen-go-v* && touch $@

$(GEN_GO_GRPC_STAMP):
	@mkdir -p $(PROTO_BIN)
	GOBIN=$(PROTO_BIN) GOWORK=off $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@rm -f $(PROTO_BIN)/.protoc-gen-go-grpc-v* && touch $@
