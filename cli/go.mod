module github.com/recmesh/recmesh/cli

go 1.26.0

require (
	github.com/recmesh/recmesh/model v0.0.0-00010101000000-000000000000
	golang.org/x/term v0.48.0
	google.golang.org/grpc v1.85.0
)

require (
	github.com/recmesh/recmesh/telemetry v0.0.0
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/recmesh/recmesh/model => ../model

replace github.com/recmesh/recmesh/telemetry => ../telemetry
