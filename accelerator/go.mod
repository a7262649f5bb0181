module github.com/recmesh/recmesh/accelerator

go 1.26.0

require github.com/recmesh/recmesh/model v0.0.0

require github.com/prometheus/client_golang v1.25.0 // indirect

require (
	github.com/gomlx/gopjrt v0.10.0 // indirect
	github.com/gomlx/stablehlo v0.2.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/recmesh/recmesh/shm v0.0.0
	github.com/recmesh/recmesh/telemetry v0.0.0
	github.com/x448/float16 v0.8.4 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/recmesh/recmesh/model => ../model

replace github.com/recmesh/recmesh/shm => ../shm

replace github.com/recmesh/recmesh/telemetry => ../telemetry
