module github.com/recmesh/recmesh/proto

go 1.26.0

require (
	github.com/nats-io/nats.go v1.55.0
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.57.0 // indirect
)

require (
	github.com/recmesh/recmesh/model v0.0.0
	golang.org/x/net v0.60.0
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)

replace github.com/recmesh/recmesh/model => ../model
