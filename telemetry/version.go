package telemetry

import (
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Version is the running binary's version, from the build info Go embeds:
// the main module's version when it was built as a tagged module
// (go install …@v1.2.3), else "devel+<12-hex revision>", with "-dirty"
// when the work tree had changes, from the VCS stamp of a build inside the
// repository, else "devel".
func Version() string {
	versionOnce.Do(func() { version, revision = readVersion(debug.ReadBuildInfo()) })
	return version
}

var (
	versionOnce       sync.Once
	version, revision string
)

func readVersion(bi *debug.BuildInfo, ok bool) (version, revision string) {
	if !ok || bi == nil {
		return "devel", ""
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v, revision
	}
	version = "devel"
	if len(revision) >= 12 {
		version += "+" + revision[:12]
	}
	if dirty {
		version += "-dirty"
	}
	return version, revision
}

// buildInfo is recmesh_build_info: constant 1, labelled with what Version
// reports, so dashboards can tell which build each process runs.
func buildInfo(service string) prometheus.Collector {
	Version()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "recmesh_build_info",
		Help:        "Always 1; the labels name the build: version (telemetry.Version), VCS revision and service.",
		ConstLabels: prometheus.Labels{"service": service, "version": version, "revision": revision},
	})
	g.Set(1)
	return g
}
