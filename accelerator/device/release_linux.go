package device

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ReleaseCode advises the kernel to reclaim the pages of the plugin's
// read-only mappings (its code and constants) that this process holds,
// and returns how many bytes it advised. Call it once programs are
// compiled: most of the plugin's resident code is XLA's compiler (109 MiB
// of the CPU plugin's after compiling the buckets), which serving never
// runs again. The pages stay in the file, so whatever a later call needs
// faults back in; the writable mappings (relocated data) are left alone,
// since reclaiming them would mean swapping.
func (r *Runtime) ReleaseCode() (int64, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("device: release plugin code: %w", err)
	}
	defer f.Close()
	var total int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		start, end, ok := r.readOnlyPluginMapping(sc.Text())
		if !ok {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, start, end-start, unix.MADV_PAGEOUT); errno != 0 {
			return total, fmt.Errorf("device: release plugin code: madvise %#x-%#x: %w", start, end, errno)
		}
		total += int64(end - start)
	}
	if err := sc.Err(); err != nil {
		return total, fmt.Errorf("device: release plugin code: %w", err)
	}
	return total, nil
}

// readOnlyPluginMapping parses one /proc/self/maps line and reports the
// range of a mapping of the plugin's file that is not writable.
func (r *Runtime) readOnlyPluginMapping(line string) (start, end uintptr, ok bool) {
	fields := strings.Fields(line)
	if len(fields) < 6 || strings.Contains(fields[1], "w") || !r.isPluginFile(fields[5]) {
		return 0, 0, false
	}
	lo, hi, found := strings.Cut(fields[0], "-")
	if !found {
		return 0, 0, false
	}
	a, err1 := strconv.ParseUint(lo, 16, 64)
	b, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || b <= a {
		return 0, 0, false
	}
	return uintptr(a), uintptr(b), true
}

// isPluginFile reports whether path, as /proc/self/maps names it, is the
// loaded plugin.
func (r *Runtime) isPluginFile(path string) bool {
	if !filepath.IsAbs(r.Path) {
		return filepath.Base(path) == filepath.Base(r.Path)
	}
	want, err := filepath.EvalSymlinks(r.Path)
	if err != nil {
		want = r.Path
	}
	return path == want || path == r.Path
}
