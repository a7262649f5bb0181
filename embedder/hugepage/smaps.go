package hugepage

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// smapsUsage sums the smaps counters, in bytes, of the mappings that lie in
// one address range.
type smapsUsage struct {
	rss, anonHuge uint64
	// kernelPage is the largest page size the kernel backs the mappings
	// with (KernelPageSize).
	kernelPage uint64
}

// parseSmaps reads a /proc/PID/smaps listing and sums Rss and AnonHugePages
// over every mapping that overlaps [start, end). The kernel may split one
// mmap into several entries (for example when part of it changes advice),
// so a region is the sum of all of them.
func parseSmaps(r io.Reader, start, end uintptr) (smapsUsage, error) {
	var u smapsUsage
	in := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		key, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if !strings.HasSuffix(key, ":") {
			// A mapping header: "lo-hi perms offset dev inode [path]".
			lo, hi, err := parseRange(key)
			if err != nil {
				return u, fmt.Errorf("smaps header %q: %w", line, err)
			}
			in = lo < end && hi > start
			continue
		}
		if !in {
			continue
		}
		var dst *uint64
		switch key {
		case "Rss:":
			dst = &u.rss
		case "AnonHugePages:":
			dst = &u.anonHuge
		case "KernelPageSize:":
		default:
			continue
		}
		kb, err := parseKB(rest)
		if err != nil {
			return u, fmt.Errorf("smaps %q: %w", line, err)
		}
		if dst == nil {
			u.kernelPage = max(u.kernelPage, kb<<10)
			continue
		}
		*dst += kb << 10
	}
	if err := sc.Err(); err != nil {
		return u, err
	}
	return u, nil
}

func parseRange(s string) (lo, hi uintptr, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("no address range")
	}
	l, err := strconv.ParseUint(a, 16, 64)
	if err != nil {
		return 0, 0, err
	}
	h, err := strconv.ParseUint(b, 16, 64)
	if err != nil {
		return 0, 0, err
	}
	return uintptr(l), uintptr(h), nil
}

// parseKB parses a counter such as "   2048 kB".
func parseKB(s string) (uint64, error) {
	f := strings.Fields(s)
	if len(f) != 2 || f[1] != "kB" {
		return 0, fmt.Errorf("want \"N kB\"")
	}
	return strconv.ParseUint(f[0], 10, 64)
}
