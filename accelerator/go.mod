module github.com/recmesh/recmesh/accelerator

go 1.26
