module github.com/recmesh/recmesh/embedder

go 1.26
