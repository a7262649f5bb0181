module github.com/recmesh/recmesh/frontend

go 1.26
