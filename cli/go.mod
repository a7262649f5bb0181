module github.com/recmesh/recmesh/cli

go 1.26.0

require (
	github.com/recmesh/recmesh/model v0.0.0-00010101000000-000000000000
	golang.org/x/term v0.48.0
)

require golang.org/x/sys v0.50.0 // indirect

replace github.com/recmesh/recmesh/model => ../model
