module github.com/recmesh/recmesh/bench

go 1.26
