module github.com/recmesh/recmesh/cli

go 1.26
