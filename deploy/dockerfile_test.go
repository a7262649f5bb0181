package deploy

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// dockerfiles are the images, each with the build arguments to check it
// under (every value of an argument that picks a variant).
var dockerfiles = []struct {
	file     string
	argSets  []map[string]string
	binaries []string // what ENTRYPOINT and HEALTHCHECK run must be among these
}{
	{"deploy/docker/frontend.Dockerfile", []map[string]string{nil}, []string{"frontend", "recmesh"}},
	{"deploy/docker/embedder.Dockerfile", []map[string]string{nil}, []string{"embedder", "recmesh"}},
	{"deploy/docker/accelerator.Dockerfile", []map[string]string{{"PJRT": "cpu"}, {"PJRT": "cuda"}}, []string{"accelerator", "recmesh"}},
}

// dockerfile is a Dockerfile parsed by BuildKit's own parser.
type dockerfile struct {
	path     string
	stages   []instructions.Stage
	metaArgs []instructions.ArgCommand
	warnings []string
}

func parseDockerfile(t *testing.T, file string) *dockerfile {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	d := &dockerfile{path: file}
	for _, w := range res.Warnings {
		d.warnings = append(d.warnings, w.Short)
	}
	lint := linter.New(&linter.Config{Warn: func(rule, desc, url, msg string, loc []parser.Range) {
		d.warnings = append(d.warnings, fmt.Sprintf("%s: %s", rule, msg))
	}})
	d.stages, d.metaArgs, err = instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return d
}

// image is one build of a Dockerfile under a set of build arguments: the
// stages the final stage is made of, in order, base first.
type image struct {
	df    *dockerfile
	args  map[string]string
	chain []int // stage indexes from the first base stage to the final one
}

// resolve evaluates the FROM lines under args (the global ARG defaults,
// overridden by args) and returns the final image, and the arguments that
// the Dockerfile does not declare.
func (d *dockerfile) resolve(args map[string]string) (*image, []string) {
	var problems []string
	vars := map[string]string{}
	for _, a := range d.metaArgs {
		for _, kv := range a.Args {
			if kv.Value != nil {
				vars[kv.Key] = *kv.Value
			}
		}
	}
	for k, v := range args {
		if _, ok := vars[k]; !ok {
			problems = append(problems, fmt.Sprintf("%s: build argument %s is not declared before the first FROM", filepath.Base(d.path), k))
		}
		vars[k] = v
	}
	img := &image{df: d, args: vars}
	for i := len(d.stages) - 1; ; {
		img.chain = append([]int{i}, img.chain...)
		base := expand(d.stages[i].BaseName, vars)
		j := d.stageIndex(base, i)
		if j < 0 {
			break // an external image
		}
		i = j
	}
	return img, problems
}

// stageIndex finds the stage a FROM or COPY --from names (by name or
// number) among the stages before stage before; -1 if none.
func (d *dockerfile) stageIndex(name string, before int) int {
	if n, err := strconv.Atoi(name); err == nil && n >= 0 && n < before {
		return n
	}
	for i := 0; i < before; i++ {
		if strings.EqualFold(d.stages[i].Name, name) {
			return i
		}
	}
	return -1
}

var varRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

func expand(s string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		name := strings.Trim(m, "${}")
		return vars[name]
	})
}

// absPaths are the absolute paths a shell command line mentions.
var absPath = regexp.MustCompile(`(?:^|[\s=:"'])(/[A-Za-z0-9_.\-/]+)`)

// outputs lists the paths a stage (with its base stages) writes: its
// WORKDIRs, COPY destinations, and the absolute paths its RUN commands
// name (go build -o /out/, pip install --target /opt/pjrt, ...).
func (d *dockerfile) outputs(stage int, vars map[string]string) []string {
	var out []string
	for i := stage; i >= 0; {
		st := d.stages[i]
		for _, c := range st.Commands {
			switch c := c.(type) {
			case *instructions.WorkdirCommand:
				out = append(out, c.Path)
			case *instructions.CopyCommand:
				out = append(out, c.DestPath)
			case *instructions.RunCommand:
				for _, m := range absPath.FindAllStringSubmatch(expand(strings.Join(c.CmdLine, " "), vars), -1) {
					out = append(out, m[1])
				}
			}
		}
		i = d.stageIndex(expand(st.BaseName, vars), i)
	}
	return out
}

// produced reports whether src is a path that outputs cover: one of them,
// inside one, or a directory holding one.
func produced(src string, outputs []string) bool {
	src = path.Clean(src)
	for _, o := range outputs {
		o = path.Clean(o)
		if src == o || strings.HasPrefix(src, o+"/") || strings.HasPrefix(o, src+"/") {
			return true
		}
	}
	return false
}

// buildContext is a build context: a directory and its .dockerignore, as
// BuildKit reads it.
type buildContext struct {
	root    string
	ignore  *patternmatcher.PatternMatcher
	modules []string // the directories go.work uses
}

func newBuildContext(t *testing.T, root string) *buildContext {
	t.Helper()
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	return &buildContext{root: root, ignore: pm, modules: workspaceModules(t, root)}
}

// sends reports whether rel (slash-separated, relative to the context
// root) is sent with the build context.
func (bc *buildContext) sends(rel string) bool {
	if rel == "." {
		return true
	}
	excluded, err := bc.ignore.MatchesOrParentMatches(rel)
	return err == nil && !excluded
}

// TestDockerfiles checks that every image builds from files that exist:
// the Dockerfile parses with BuildKit's parser without warnings; each COPY
// from the build context names files that exist there and that
// .dockerignore does not leave out; each COPY --from names an earlier
// stage and a path that stage writes; the final image runs as a non-root
// user and has a health check, and its ENTRYPOINT and HEALTHCHECK run
// binaries that were copied in.
func TestDockerfiles(t *testing.T) {
	root := repoRoot(t)
	bc := newBuildContext(t, root)
	for _, tc := range dockerfiles {
		t.Run(filepath.Base(tc.file), func(t *testing.T) {
			d := parseDockerfile(t, filepath.Join(root, tc.file))
			for _, w := range d.warnings {
				t.Errorf("%s: %s", tc.file, w)
			}
			for _, args := range tc.argSets {
				for _, p := range checkImage(bc, d, args, tc.binaries) {
					t.Error(p)
				}
			}
		})
	}
}

// checkImage returns what is wrong with building d under args.
func checkImage(bc *buildContext, d *dockerfile, args map[string]string, binaries []string) []string {
	img, problems := d.resolve(args)
	problems = append(problems, checkCopies(bc, img)...)
	return append(problems, checkFinal(img, binaries)...)
}

func checkCopies(bc *buildContext, img *image) []string {
	var problems []string
	d := img.df
	for si, st := range d.stages {
		for _, c := range st.Commands {
			var srcs []string
			from := ""
			switch c := c.(type) {
			case *instructions.CopyCommand:
				srcs, from = c.SourcePaths, expand(c.From, img.args)
			case *instructions.AddCommand:
				srcs = c.SourcePaths
			default:
				continue
			}
			where := fmt.Sprintf("%s stage %q: %s", filepath.Base(d.path), st.Name, c.Name())
			if from == "" {
				for _, src := range srcs {
					problems = append(problems, checkContextSource(bc, where, expand(src, img.args))...)
				}
				continue
			}
			j := d.stageIndex(from, si)
			if j < 0 {
				if strings.ContainsAny(from, ":/") {
					continue // an external image: nothing to check here
				}
				problems = append(problems, fmt.Sprintf("%s --from=%s: no earlier stage of that name", where, from))
				continue
			}
			outs := d.outputs(j, img.args)
			for _, src := range srcs {
				if !produced(expand(src, img.args), outs) {
					problems = append(problems, fmt.Sprintf("%s --from=%s %s: stage %q writes no such path (it writes %v)", where, from, src, d.stages[j].Name, outs))
				}
			}
		}
	}
	return problems
}

// checkContextSource checks one COPY source from the build context.
func checkContextSource(bc *buildContext, where, src string) []string {
	var problems []string
	rel := path.Clean(strings.TrimPrefix(src, "/"))
	matches, err := filepath.Glob(filepath.Join(bc.root, filepath.FromSlash(rel)))
	if err != nil || len(matches) == 0 {
		return []string{fmt.Sprintf("%s %s: no such file in the build context", where, src)}
	}
	for _, m := range matches {
		r, _ := filepath.Rel(bc.root, m)
		if !bc.sends(filepath.ToSlash(r)) {
			problems = append(problems, fmt.Sprintf("%s %s: .dockerignore leaves out %s", where, src, r))
		}
	}
	if rel != "." {
		return problems
	}
	// The whole context: the Go workspace must be in it.
	need := []string{"go.work", "go.work.sum"}
	for _, m := range bc.modules {
		need = append(need, path.Join(filepath.ToSlash(m), "go.mod"))
	}
	for _, n := range need {
		if _, err := os.Stat(filepath.Join(bc.root, n)); err != nil {
			problems = append(problems, fmt.Sprintf("%s: the workspace needs %s, which does not exist", where, n))
		} else if !bc.sends(n) {
			problems = append(problems, fmt.Sprintf("%s: .dockerignore leaves out %s, which the Go build needs", where, n))
		}
	}
	return problems
}

// checkFinal checks the final image: a non-root USER, a HEALTHCHECK, and
// ENTRYPOINT and HEALTHCHECK commands that run binaries copied in.
func checkFinal(img *image, binaries []string) []string {
	var problems []string
	d := img.df
	name := fmt.Sprintf("%s (args %v)", filepath.Base(d.path), img.args)
	var user string
	var health *instructions.HealthCheckCommand
	var entrypoint []string
	var copied []string
	envs := map[string]string{}
	for _, i := range img.chain {
		for _, c := range d.stages[i].Commands {
			switch c := c.(type) {
			case *instructions.EnvCommand:
				for _, kv := range c.Env {
					envs[kv.Key] = kv.Value
				}
			case *instructions.UserCommand:
				user = c.User
			case *instructions.HealthCheckCommand:
				health = c
			case *instructions.EntrypointCommand:
				entrypoint = c.CmdLine
			case *instructions.CopyCommand:
				for _, s := range c.SourcePaths {
					dst := c.DestPath
					if strings.HasSuffix(dst, "/") {
						dst = path.Join(dst, path.Base(s))
					}
					copied = append(copied, dst)
				}
			}
		}
	}
	uid, _, _ := strings.Cut(expand(user, img.args), ":")
	if uid == "" || uid == "root" || uid == "0" {
		problems = append(problems, fmt.Sprintf("%s: the final image runs as %q; want a non-root USER", name, user))
	} else if _, err := strconv.Atoi(uid); err != nil {
		problems = append(problems, fmt.Sprintf("%s: USER %q: want a numeric uid, which Kubernetes' runAsNonRoot can verify", name, user))
	}
	if health == nil || len(health.Health.Test) < 2 || health.Health.Test[0] == "NONE" {
		problems = append(problems, fmt.Sprintf("%s: no HEALTHCHECK", name))
	} else {
		problems = append(problems, checkRuns(name, "HEALTHCHECK", health.Health.Test[1:], copied, binaries)...)
		if !slices.Contains(health.Health.Test, "health") {
			problems = append(problems, fmt.Sprintf("%s: HEALTHCHECK %v: want `recmesh health`", name, health.Health.Test))
		}
	}
	problems = append(problems, checkImageMetricsAddr(name, envs["RECMESH_METRICS_ADDR"], health)...)
	if len(entrypoint) == 0 {
		problems = append(problems, fmt.Sprintf("%s: no ENTRYPOINT", name))
	} else {
		problems = append(problems, checkRuns(name, "ENTRYPOINT", entrypoint, copied, binaries)...)
	}
	return problems
}

// checkImageMetricsAddr: the processes bind /metrics and /healthz to
// loopback unless told otherwise, and a container is scraped from outside:
// the image sets RECMESH_METRICS_ADDR to every interface, and an HTTP
// HEALTHCHECK asks a port of it.
func checkImageMetricsAddr(name, addr string, health *instructions.HealthCheckCommand) []string {
	ports, err := metricsPorts(addr)
	if err != nil {
		return []string{fmt.Sprintf("%s: ENV RECMESH_METRICS_ADDR=%q: %v; want \":port\" (the default is loopback only)", name, addr, err)}
	}
	if host, _, _ := net.SplitHostPort(addr); host != "" && host != "0.0.0.0" && host != "::" {
		return []string{fmt.Sprintf("%s: ENV RECMESH_METRICS_ADDR=%q: want every interface (\":port\"), for Prometheus", name, addr)}
	}
	if health == nil {
		return nil
	}
	for i, a := range health.Health.Test {
		if a != "--http" || i+1 >= len(health.Health.Test) {
			continue
		}
		u, err := url.Parse(health.Health.Test[i+1])
		if err != nil {
			return []string{fmt.Sprintf("%s: HEALTHCHECK --http %q: %v", name, health.Health.Test[i+1], err)}
		}
		p, _ := strconv.Atoi(u.Port())
		if !slices.Contains(ports, p) {
			return []string{fmt.Sprintf("%s: HEALTHCHECK asks %s, not a port of RECMESH_METRICS_ADDR=%q", name, u.Host, addr)}
		}
	}
	return nil
}

func checkRuns(name, what string, argv, copied, binaries []string) []string {
	var problems []string
	bin := argv[0]
	if !slices.Contains(copied, bin) {
		problems = append(problems, fmt.Sprintf("%s: %s runs %s, which no COPY puts there (copied: %v)", name, what, bin, copied))
	}
	if !slices.Contains(binaries, path.Base(bin)) {
		problems = append(problems, fmt.Sprintf("%s: %s runs %s; want one of %v", name, what, bin, binaries))
	}
	return problems
}

// TestDockerfileGoPackages checks that the packages the images build exist
// in the workspace. A package another change is still adding is reported
// as a skip, not a failure.
func TestDockerfileGoPackages(t *testing.T) {
	root := repoRoot(t)
	pkg := regexp.MustCompile(`\./[a-z0-9_\-]+(?:/[a-z0-9_\-]+)*/cmd/[a-z0-9_\-]+`)
	var missing []string
	for _, tc := range dockerfiles {
		d := parseDockerfile(t, filepath.Join(root, tc.file))
		n := 0
		for _, st := range d.stages {
			for _, c := range st.Commands {
				r, ok := c.(*instructions.RunCommand)
				if !ok {
					continue
				}
				for _, p := range pkg.FindAllString(strings.Join(r.CmdLine, " "), -1) {
					n++
					if _, err := os.Stat(filepath.Join(root, p)); err != nil {
						missing = append(missing, fmt.Sprintf("%s builds %s", filepath.Base(tc.file), p))
					}
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: builds no ./<module>/cmd/<name> package", tc.file)
		}
	}
	if len(missing) > 0 {
		t.Skipf("not in the tree yet: %s", strings.Join(missing, "; "))
	}
}

// TestDockerfileCheckerCatches feeds the checks a broken Dockerfile and
// context, so that a check that stopped checking shows.
func TestDockerfileCheckerCatches(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"go.work":       "go 1.26.0\n\nuse (\n\t./a\n)\n",
		"go.work.sum":   "",
		"a/go.mod":      "module example.com/a\n",
		"secret/key":    "k",
		".dockerignore": "secret\ngo.work.sum\n",
		"Dockerfile": `ARG BASE=debian:bookworm-slim
FROM golang:1.26-bookworm AS build
COPY . .
RUN go build -o /out/ ./a/cmd/x
FROM ${BASE}
COPY missing.txt /x
COPY secret/key /k
COPY --from=build /elsewhere/bin /usr/local/bin/
COPY --from=nope /x /y
COPY --from=build /out/x /usr/local/bin/
HEALTHCHECK CMD ["/usr/local/bin/y", "health"]
ENTRYPOINT ["/usr/local/bin/x"]
`,
	}
	for name, body := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	got := strings.Join(checkImage(newBuildContext(t, root), d, map[string]string{"NOPE": "1"}, []string{"x"}), "\n")
	for _, want := range []string{
		"build argument NOPE is not declared",
		"missing.txt: no such file",
		".dockerignore leaves out secret/key",
		".dockerignore leaves out go.work.sum",
		"/elsewhere/bin: stage \"build\" writes no such path",
		"--from=nope: no earlier stage",
		"runs as \"\"; want a non-root USER",
		"HEALTHCHECK runs /usr/local/bin/y, which no COPY puts there",
		"ENV RECMESH_METRICS_ADDR=\"\"",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("problems do not mention %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "ENTRYPOINT") {
		t.Errorf("ENTRYPOINT runs a copied binary, yet:\n%s", got)
	}
}

// TestDockerfilesShareBuildStage: the three images' build stages are the
// same text, so a builder's cache compiles the binaries once for all three
// (the classic builder has no cache mounts to fall back on), and none of
// them uses a BuildKit-only instruction flag, which the classic builder
// (an engine without buildx) refuses.
func TestDockerfilesShareBuildStage(t *testing.T) {
	var first, firstPath string
	for _, df := range dockerfiles {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), df.file))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if strings.Contains(s, "--mount=") || strings.HasPrefix(s, "# syntax=") {
			t.Errorf("%s uses RUN --mount or a # syntax= line: the classic builder cannot build it, and an offline BuildKit cannot fetch the syntax image", df.file)
		}
		start := strings.Index(s, "FROM ${GO_IMAGE} AS build\n")
		if start < 0 {
			t.Errorf("%s has no \"FROM ${GO_IMAGE} AS build\" stage", df.file)
			continue
		}
		stage := s[start:]
		if end := strings.Index(stage[1:], "\nFROM "); end >= 0 {
			stage = stage[:end+1]
		}
		if first == "" {
			first, firstPath = stage, df.file
		} else if stage != first {
			t.Errorf("%s's build stage differs from %s's:\n%s\nwant\n%s", df.file, firstPath, stage, first)
		}
	}
}
