package hugepage

import (
	"strings"
	"testing"
)

const sampleSmaps = `7f0000000000-7f0000400000 rw-p 00000000 00:00 0 
Size:               4096 kB
KernelPageSize:        4 kB
Rss:                4096 kB
AnonHugePages:      4096 kB
VmFlags: rd wr mr mw me ac sd hg
7f0000400000-7f0000600000 rw-p 00000000 00:00 0 
Size:               2048 kB
Rss:                1024 kB
AnonHugePages:         0 kB
VmFlags: rd wr mr mw me ac sd
7f0000600000-7f0000800000 rw-p 00000000 00:00 0    /usr/lib/libfoo.so
KernelPageSize:     2048 kB
Rss:                2048 kB
AnonHugePages:      2048 kB
`

func TestParseSmaps(t *testing.T) {
	for _, tc := range []struct {
		name          string
		lo, hi        uintptr
		rss, anonHuge uint64
		page          uint64
	}{
		{"first", 0x7f0000000000, 0x7f0000400000, 4096 << 10, 4096 << 10, 4 << 10},
		{"split region", 0x7f0000000000, 0x7f0000600000, 5120 << 10, 4096 << 10, 4 << 10},
		{"partial overlap", 0x7f0000500000, 0x7f0000700000, 3072 << 10, 2048 << 10, 2048 << 10},
		{"outside", 0x1000, 0x2000, 0, 0, 0},
	} {
		u, err := parseSmaps(strings.NewReader(sampleSmaps), tc.lo, tc.hi)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if u.rss != tc.rss || u.anonHuge != tc.anonHuge || u.kernelPage != tc.page {
			t.Errorf("%s: got rss %d anonHuge %d page %d, want %d %d %d", tc.name, u.rss, u.anonHuge, u.kernelPage, tc.rss, tc.anonHuge, tc.page)
		}
	}
}

func TestParseSmapsErrors(t *testing.T) {
	for _, in := range []string{
		"zz-7f rw-p 0 00:00 0\n",
		"1000-2000 rw-p 0 00:00 0\nRss: lots\n",
	} {
		if _, err := parseSmaps(strings.NewReader(in), 0x1000, 0x2000); err == nil {
			t.Errorf("parseSmaps(%q) succeeded", in)
		}
	}
}
