# k8s.mk — the Kubernetes manifests against a real API server
# (docs/deployment.md, Kubernetes).
#
#   make k8s-bin           etcd, kube-apiserver and kubectl built from their
#                          Go modules (deploy/local/build-k8s.sh) into
#                          K8S_BIN, a cache outside the checkout: the first
#                          build takes long on a small machine, later runs
#                          find it
#   make k8s-server-test   etcd and kube-apiserver started with their own
#                          certificates, Pod Security admission on; every
#                          kustomization applied (the base with
#                          `kubectl apply -k`) with the NATS identities'
#                          Secrets from `recmesh nats-identities
#                          --kubernetes-secrets`, and a Pod of every
#                          Deployment created with --dry-run=server; any
#                          refusal, warning or missing Secret fails it
#   make k8s-node-bin      also kube-controller-manager, kube-scheduler,
#                          kubelet and kube-proxy, and CoreDNS from its
#                          module, into the same cache
#   make k8s-test          a real one-node cluster (deploy/local/k8s-node.sh,
#                          as root: containerd, runc, the CNI plugins and
#                          iptables from Debian), the mesh's images imported,
#                          deploy/k8s applied and run under load: scaled,
#                          rolled, killed, a model rolled out; ends with the
#                          `k8s ok:` line. The node is stopped afterwards.
#
# Included by the root Makefile; CI runs k8s-server-test.

.PHONY: k8s-bin k8s-server-test k8s-node-bin k8s-node-packages k8s-test
K8S_VERSION  ?= v1.36.3
ETCD_VERSION ?= v3.6.8
COREDNS_VERSION ?= v1.14.7
K8S_CACHE    ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/recmesh
K8S_BIN      ?= $(K8S_CACHE)/k8s-$(K8S_VERSION)-etcd-$(ETCD_VERSION)/bin
COREDNS_BIN  ?= $(K8S_CACHE)/coredns-$(COREDNS_VERSION)/coredns
K8S_NODE_STATE ?= $(DEPS)/k8s-node
K8S_IMAGES   := recmesh/frontend:dev recmesh/embedder:dev recmesh/accelerator:dev nats:2.12-alpine

k8s-bin:
	@mkdir -p $(DEPS)
	ETCD_VERSION=$(ETCD_VERSION) deploy/local/build-k8s.sh $(K8S_VERSION) $(K8S_BIN) etcd kube-apiserver kubectl > $(DEPS)/k8s-bin.log 2>&1 || { \
		tail -n 40 $(DEPS)/k8s-bin.log; echo "k8s-bin: failed (whole log in .deps/k8s-bin.log)"; exit 1; }
	@grep '^build-k8s:' $(DEPS)/k8s-bin.log || echo "k8s-bin: etcd, kube-apiserver and kubectl already in $(K8S_BIN)"

k8s-server-test: k8s-bin build
	cd deploy && RECMESH_K8S_BIN=$(K8S_BIN) RECMESH_K8S_RECMESH=$(BIN)/recmesh $(GO) test -count=1 -timeout 15m -run '^TestK8sServer$$' -v . > $(DEPS)/k8s-server-test.log 2>&1 || { \
		grep -E '^\s*(--- |k8s_server_test.go:[0-9]+: )' $(DEPS)/k8s-server-test.log; tail -n 60 $(DEPS)/k8s-server-test.log; \
		echo "k8s-server-test: failed (whole log in .deps/k8s-server-test.log)"; exit 1; }
	@grep -E '^\s*--- ' $(DEPS)/k8s-server-test.log
	@grep '^k8s-server ok:' $(DEPS)/k8s-server-test.log

k8s-node-bin:
	@mkdir -p $(DEPS)
	ETCD_VERSION=$(ETCD_VERSION) deploy/local/build-k8s.sh $(K8S_VERSION) $(K8S_BIN) etcd kube-apiserver kubectl \
		kube-controller-manager kube-scheduler kubelet kube-proxy > $(DEPS)/k8s-node-bin.log 2>&1 || { \
		tail -n 40 $(DEPS)/k8s-node-bin.log; echo "k8s-node-bin: failed (whole log in .deps/k8s-node-bin.log)"; exit 1; }
	@grep '^build-k8s:' $(DEPS)/k8s-node-bin.log || echo "k8s-node-bin: the cluster's commands already in $(K8S_BIN)"
	@test -x $(COREDNS_BIN) || deploy/local/build-tool.sh github.com/coredns/coredns $(COREDNS_VERSION) . $(COREDNS_BIN)

## k8s-node-packages: what the node takes from Debian.
k8s-node-packages:
	@command -v containerd >/dev/null && command -v runc >/dev/null && command -v iptables >/dev/null && test -x /usr/lib/cni/bridge || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd runc containernetworking-plugins iptables >/dev/null; }

## k8s-test: the node is stopped whatever the outcome; its logs stay in
## .deps/k8s-node/logs.
k8s-test: deps k8s-node-bin k8s-node-packages build images
	@rc=0; export K8S_BIN=$(K8S_BIN) COREDNS=$(COREDNS_BIN); \
	deploy/local/k8s-node.sh start $(K8S_NODE_STATE) && deploy/local/k8s-node.sh import $(K8S_NODE_STATE) $(K8S_IMAGES) && \
	KUBECONFIG=$(K8S_NODE_STATE)/pki/admin.kubeconfig RECMESH_K8S_TEST=1 RECMESH_K8S_KUBECTL=$(K8S_BIN)/kubectl \
		RECMESH_K8S_CTR=ctr RECMESH_K8S_CONTAINERD=$(K8S_NODE_STATE)/containerd.sock RECMESH_K8S_RECMESH=$(BIN)/recmesh \
		$(GO) test -count=1 -timeout 40m -run '^TestK8s$$' -v ./cli/e2e/ > $(DEPS)/k8s-test.log 2>&1 || rc=$$?; \
	deploy/local/k8s-node.sh stop $(K8S_NODE_STATE) || rc=1; \
	deploy/local/engine.sh stop $(COMPOSE_DIR); \
	if [ $$rc != 0 ]; then tail -n 80 $(DEPS)/k8s-test.log; echo "k8s-test: failed (whole log in .deps/k8s-test.log, the node's in .deps/k8s-node/logs)"; exit 1; fi
	@grep -E '^\s*(--- |k8s_test.go:[0-9]+: )' $(DEPS)/k8s-test.log || true
	@grep '^k8s ok:' $(DEPS)/k8s-test.log
