// benchrun: the bench module's sweep driver (bench/internal/benchrun) and
// the report's charts, outside the workspace (go.work) so that gonum/plot
// stays out of every other module's build (main.go says why); built with
// GOWORK=off (make bench-benchrun). The versions of the modules it shares
// with the workspace are those the workspace selects (go list -m all at
// the repository root), so that benchrun links the same code as the
// workspace builds.
module github.com/recmesh/recmesh/bench/cmd/benchrun

go 1.26.0

require (
	github.com/recmesh/recmesh/bench v0.0.0
	gonum.org/v1/plot v0.15.2
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.1.0 // indirect
	codeberg.org/go-pdf/fpdf v0.10.0 // indirect
	git.sr.ht/~sbinet/gg v0.6.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/campoy/embedmd v1.0.0 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/recmesh/recmesh/model v0.0.0 // indirect
	github.com/recmesh/recmesh/proto v0.0.0-00010101000000-000000000000 // indirect
	golang.org/x/image v0.25.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261019180522-ce908d29299b // indirect
	google.golang.org/grpc v1.85.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace (
	github.com/recmesh/recmesh/bench => ../..
	github.com/recmesh/recmesh/model => ../../../model
	github.com/recmesh/recmesh/proto => ../../../proto
)
