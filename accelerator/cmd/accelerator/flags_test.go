package main

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/accelerator/stripdot"
)

func TestCommonFlagsEnvTwins(t *testing.T) {
	parse := func(args ...string) (commonFlags, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var c commonFlags
		c.register(fs)
		return c, c.parse(fs, args)
	}
	t.Setenv("RECMESH_BUNDLE", "/b")
	t.Setenv("RECMESH_MAX_BATCH", "256")
	c, err := parse()
	if err != nil || c.bundle != "/b" || c.maxBatch != 256 {
		t.Fatalf("env twins: %+v, %v", c, err)
	}
	if c, err := parse("--max-batch=8"); err != nil || c.maxBatch != 8 {
		t.Fatalf("the command line must win: %+v, %v", c, err)
	}
	t.Setenv("RECMESH_MAX_BATCH", "lots")
	if _, err := parse(); err == nil || !strings.Contains(err.Error(), "RECMESH_MAX_BATCH") {
		t.Fatalf("a malformed twin must fail naming it, got %v", err)
	}
	t.Setenv("RECMESH_MAX_BATCH", "")
	if _, err := parse("--max-batch=0"); err == nil || !strings.Contains(err.Error(), "--max-batch") {
		t.Fatalf("out-of-range --max-batch: %v", err)
	}
}

func TestBenchBuckets(t *testing.T) {
	parse := func(args ...string) (bucketList, commonFlags, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var c commonFlags
		c.register(fs)
		var l bucketList
		fs.Var(&l, "buckets", "")
		if err := c.parse(fs, args); err != nil {
			return l, c, err
		}
		return l, c, l.fit(fs, &c)
	}
	l, c, err := parse("--buckets", "128,1, 16,16")
	if err != nil || l.String() != "1,16,128" || c.maxBatch != 128 {
		t.Fatalf("--buckets 128,1,16,16: %v, max-batch %d, %v; want 1,16,128 and max-batch 128", l.buckets, c.maxBatch, err)
	}
	if _, c, err := parse("--buckets", "1,16", "--max-batch", "4096"); err != nil || c.maxBatch != 4096 {
		t.Fatalf("an explicit --max-batch must stay: %d, %v", c.maxBatch, err)
	}
	if _, _, err := parse("--buckets", "64", "--max-batch", "40"); err != nil {
		t.Fatalf("--max-batch 40 compiles bucket 64: %v", err)
	}
	if _, c, err := parse(); err != nil || c.maxBatch != 4096 {
		t.Fatalf("no --buckets: max-batch %d, %v", c.maxBatch, err)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--buckets", "3"}, `bucket "3" is not a power of two`},
		{[]string{"--buckets", "1,,2"}, `bucket "" is not a power of two`},
		{[]string{"--buckets", "0"}, `bucket "0"`},
		{[]string{"--buckets", "128", "--max-batch", "64"}, "--buckets 128: bucket 128 is above --max-batch 64"},
	} {
		if _, _, err := parse(tc.args...); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.msg)
		}
	}
	t.Setenv("RECMESH_BUCKETS", "1,8")
	if l, c, err := parse(); err != nil || l.String() != "1,8" || c.maxBatch != 8 {
		t.Errorf("RECMESH_BUCKETS: %v, max-batch %d, %v", l.buckets, c.maxBatch, err)
	}
}

func TestProgramAndThreadFlags(t *testing.T) {
	parse := func(args ...string) (commonFlags, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var c commonFlags
		c.register(fs)
		return c, c.parse(fs, args)
	}
	c, err := parse()
	if err != nil || c.program != "default" || c.xlaThreads != 0 {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	if o := c.executorOptions(nil); o.Program == nil || !o.Program.SplitFirstProduct || o.MaxBatch != c.maxBatch {
		t.Fatalf("default program options: %+v", o)
	}
	c, err = parse("--program", "plain", "--xla-threads", "3")
	if err != nil || c.xlaThreads != 3 {
		t.Fatalf("--program plain --xla-threads 3: %+v, %v", c, err)
	}
	if o := c.executorOptions(nil); o.Program == nil || o.Program.SplitFirstProduct {
		t.Fatalf("plain program options: %+v", o.Program)
	}
	t.Setenv("RECMESH_XLA_THREADS", "2")
	if c, err := parse(); err != nil || c.xlaThreads != 2 {
		t.Fatalf("RECMESH_XLA_THREADS: %+v, %v", c, err)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--program", "fast"}, `--program "fast"`},
		{[]string{"--xla-threads", "-1"}, "--xla-threads -1"},
	} {
		if _, err := parse(tc.args...); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.msg)
		}
	}
}

func TestStripDotPrefetchFlag(t *testing.T) {
	parse := func(args ...string) error {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var c commonFlags
		c.register(fs)
		return c.parse(fs, args)
	}
	t.Cleanup(func() { stripdot.SetPrefetch(0) })
	if err := parse(); err != nil || stripdot.Prefetch() != stripdot.DefaultPrefetch() {
		t.Fatalf("default: prefetch %d, want %d (%v)", stripdot.Prefetch(), stripdot.DefaultPrefetch(), err)
	}
	if !stripdot.Supported() {
		t.Skip(stripdot.ErrUnsupported) // no kernel, no distance to read back
	}
	if err := parse("--strip-dot-prefetch-bytes", "4096"); err != nil || stripdot.Prefetch() != 4096 {
		t.Fatalf("--strip-dot-prefetch-bytes 4096: prefetch %d, %v", stripdot.Prefetch(), err)
	}
	t.Setenv("RECMESH_STRIP_DOT_PREFETCH_BYTES", "1024")
	if err := parse(); err != nil || stripdot.Prefetch() != 1024 {
		t.Fatalf("RECMESH_STRIP_DOT_PREFETCH_BYTES=1024: prefetch %d, %v", stripdot.Prefetch(), err)
	}
	for _, bad := range []string{"100", "-64", "1048576"} {
		err := parse("--strip-dot-prefetch-bytes", bad)
		if err == nil || !strings.Contains(err.Error(), "--strip-dot-prefetch-bytes") || !strings.Contains(err.Error(), " "+bad+" ") {
			t.Errorf("--strip-dot-prefetch-bytes %s: %v, want an error naming the flag and value", bad, err)
		}
		if stripdot.Prefetch() != 1024 {
			t.Errorf("a refused --strip-dot-prefetch-bytes %s moved the distance to %d", bad, stripdot.Prefetch())
		}
	}
}
