module github.com/recmesh/recmesh/bench

go 1.26.0

require (
	github.com/recmesh/recmesh/model v0.0.0
	github.com/recmesh/recmesh/proto v0.0.0-00010101000000-000000000000
	golang.org/x/net v0.60.0
	golang.org/x/sys v0.50.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261019180522-ce908d29299b // indirect
)

replace (
	github.com/recmesh/recmesh/model => ../model
	github.com/recmesh/recmesh/proto => ../proto
)
