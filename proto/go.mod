module github.com/recmesh/recmesh/proto

go 1.26
