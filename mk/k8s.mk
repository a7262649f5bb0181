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
#
# Included by the root Makefile; CI runs k8s-server-test.

.PHONY: k8s-bin k8s-server-test
K8S_VERSION  ?= v1.36.3
ETCD_VERSION ?= v3.6.8
K8S_CACHE    ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/recmesh
K8S_BIN      ?= $(K8S_CACHE)/k8s-$(K8S_VERSION)-etcd-$(ETCD_VERSION)/bin

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
