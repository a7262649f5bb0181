module github.com/recmesh/recmesh/cli

go 1.26.0

require (
	github.com/nats-io/nats-server/v2 v2.15.2
	github.com/nats-io/nats.go v1.55.0
	github.com/nats-io/nkeys v0.4.16
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.72.0
	github.com/recmesh/recmesh/model v0.0.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
	golang.org/x/term v0.48.0
	google.golang.org/grpc v1.85.0
)

require (
	github.com/antithesishq/antithesis-sdk-go v0.8.0-default-no-op // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/fatih/color v1.19.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/gomlx/gopjrt v0.10.0 // indirect
	github.com/gomlx/stablehlo v0.2.0 // indirect
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.30.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/minio/highwayhash v1.0.4 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/nats-io/jwt/v2 v2.8.2 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/summerwind/h2spec v2.2.1+incompatible
	github.com/x448/float16 v0.8.4 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc v0.72.0 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace v1.47.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/proto/otlp v1.11.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20261019180522-ce908d29299b // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
)

require (
	github.com/recmesh/recmesh/accelerator v0.0.0
	github.com/recmesh/recmesh/bench v0.0.0
	github.com/recmesh/recmesh/deploy v0.0.0
	github.com/recmesh/recmesh/embedder v0.0.0
	github.com/recmesh/recmesh/frontend v0.0.0
	github.com/recmesh/recmesh/proto v0.0.0
	github.com/recmesh/recmesh/shm v0.0.0 // indirect
	github.com/recmesh/recmesh/telemetry v0.0.0
	golang.org/x/net v0.61.0
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261019180522-ce908d29299b // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/recmesh/recmesh/model => ../model

replace github.com/recmesh/recmesh/telemetry => ../telemetry

replace github.com/recmesh/recmesh/proto => ../proto

replace github.com/recmesh/recmesh/embedder => ../embedder

replace github.com/recmesh/recmesh/accelerator => ../accelerator

replace github.com/recmesh/recmesh/frontend => ../frontend

replace github.com/recmesh/recmesh/shm => ../shm

replace github.com/recmesh/recmesh/deploy => ../deploy

replace github.com/recmesh/recmesh/bench => ../bench
