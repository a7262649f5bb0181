// Package deploy holds recmesh's deployment files and the tests that check
// them: the container images (docker/*.Dockerfile), the compose stack
// (../compose.yaml with prometheus/ and grafana/), and the Kubernetes
// manifests (k8s/, kustomize). The Go code is the expected set of metrics
// (metrics.go) that the dashboard and the Prometheus configuration may use;
// everything else here is data, validated by the tests with the real
// loaders: compose-go, the Kubernetes API types, kustomize (krusty) and
// BuildKit's Dockerfile parser. See docs/deployment.md.
package deploy
