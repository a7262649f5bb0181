module github.com/recmesh/recmesh/model

go 1.26
