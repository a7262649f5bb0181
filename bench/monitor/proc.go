package monitor

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The /proc readers the monitor samples with.

// stat is what monitor uses of /proc/<pid>/stat.
type stat struct {
	comm         string
	ppid         int
	minflt       uint64 // minor page faults
	utime, stime uint64
	start        uint64
}

func readStat(root string, pid int) (stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/stat", root, pid))
	if err != nil {
		return stat{}, err
	}
	return parseStat(b)
}

// parseStat parses a stat line. The command name is in parentheses and
// may itself hold spaces and parentheses, so the fields after it are found
// from the last ')'.
func parseStat(b []byte) (stat, error) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return stat{}, fmt.Errorf("monitor: malformed stat %q", b)
	}
	// After the name: state(3) ppid(4) … minflt(10) … utime(14) stime(15) …
	// starttime(22); f[0] is field 3.
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 20 {
		return stat{}, fmt.Errorf("monitor: stat has %d fields after the name, want ≥ 20", len(f))
	}
	var s stat
	var err error
	s.comm = string(b[open+1 : end])
	if s.ppid, err = strconv.Atoi(f[1]); err != nil {
		return stat{}, fmt.Errorf("monitor: stat ppid: %w", err)
	}
	if s.minflt, err = strconv.ParseUint(f[7], 10, 64); err != nil {
		return stat{}, fmt.Errorf("monitor: stat minflt: %w", err)
	}
	if s.utime, err = strconv.ParseUint(f[11], 10, 64); err != nil {
		return stat{}, fmt.Errorf("monitor: stat utime: %w", err)
	}
	if s.stime, err = strconv.ParseUint(f[12], 10, 64); err != nil {
		return stat{}, fmt.Errorf("monitor: stat stime: %w", err)
	}
	if s.start, err = strconv.ParseUint(f[19], 10, 64); err != nil {
		return stat{}, fmt.Errorf("monitor: stat starttime: %w", err)
	}
	return s, nil
}

// readRSS returns VmRSS in bytes (absent for a zombie, which is an error).
func readRSS(root string, pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/status", root, pid))
	if err != nil {
		return 0, err
	}
	return kBField(b, "VmRSS:")
}

// hugeFile identifies a hugetlbfs file (or SysV/memfd hugetlb object)
// mapped shared: its device and inode as /proc/<pid>/smaps prints them.
type hugeFile struct {
	dev   string
	inode uint64
}

// memory is one process's proportional share of memory.
type memory struct {
	// pss is the kernel's Pss (shared pages split among their mappers,
	// transparent huge pages included, hugetlb pages not).
	pss int64
	// privateHugetlb is hugetlb memory only this process maps.
	privateHugetlb int64
	// sharedHugetlb is, per file, the shared hugetlb memory this process
	// maps (nil when none).
	sharedHugetlb map[hugeFile]int64
}

// readPSS returns a process's memory from smaps_rollup and, only when it
// maps shared hugetlb memory, the per-file split from smaps (whose read is
// far costlier, so the common case never pays for it).
func readPSS(root string, pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("%s/%d/smaps_rollup", root, pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	if m.pss, err = kBField(b, "Pss:"); err != nil {
		return memory{}, err
	}
	// Kernels before 4.4 have no hugetlb lines; they count as zero.
	m.privateHugetlb, _ = kBField(b, "Private_Hugetlb:")
	shared, _ := kBField(b, "Shared_Hugetlb:")
	if shared == 0 {
		return m, nil
	}
	full, err := os.ReadFile(fmt.Sprintf("%s/%d/smaps", root, pid))
	if err != nil {
		return memory{}, err
	}
	m.sharedHugetlb = sharedHugetlbByFile(full)
	return m, nil
}

// sharedHugetlbByFile sums the Shared_Hugetlb of every mapping in an smaps
// file by the file mapped. A mapping's header is
// "start-end perms offset dev inode [path]"; its fields follow as
// "Name: value kB" lines.
func sharedHugetlbByFile(smaps []byte) map[hugeFile]int64 {
	out := map[hugeFile]int64{}
	var cur hugeFile
	for line := range bytes.Lines(smaps) {
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !bytes.HasSuffix(f[0], []byte(":")) {
			// A mapping header: the address range has no colon.
			if len(f) >= 5 {
				ino, _ := strconv.ParseUint(string(f[4]), 10, 64)
				cur = hugeFile{dev: string(f[3]), inode: ino}
			}
			continue
		}
		if string(f[0]) == "Shared_Hugetlb:" && len(f) >= 2 {
			if n, err := strconv.ParseInt(string(f[1]), 10, 64); err == nil && n > 0 {
				out[cur] += n * 1024
			}
		}
	}
	return out
}

// kBField finds the line "<name> <n> kB" and returns n·1024.
func kBField(b []byte, name string) (int64, error) {
	for line := range bytes.Lines(b) {
		rest, ok := bytes.CutPrefix(line, []byte(name))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) < 1 {
			break
		}
		n, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("monitor: %s %q: %w", name, f[0], err)
		}
		return n * 1024, nil
	}
	return 0, fmt.Errorf("monitor: no %s line", name)
}

// atClkTck is the auxiliary-vector key of the clock tick rate.
const atClkTck = 17

// DefaultClockTicks is assumed when the tick rate cannot be read.
const DefaultClockTicks = 100

// ClockTicks returns sysconf(_SC_CLK_TCK), read from AT_CLKTCK in
// /proc/self/auxv, and "auxv"; or DefaultClockTicks and "default" when the
// auxiliary vector cannot be read or lacks the entry.
func ClockTicks() (int64, string) {
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return DefaultClockTicks, "default"
	}
	if v, ok := auxvLookup(b, atClkTck); ok && v > 0 {
		return int64(v), "auxv"
	}
	return DefaultClockTicks, "default"
}

// auxvLookup finds key in an auxiliary vector of native-endian word pairs
// (8-byte words: recmesh runs on 64-bit Linux only).
func auxvLookup(b []byte, key uint64) (uint64, bool) {
	for len(b) >= 16 {
		k, v := binary.NativeEndian.Uint64(b), binary.NativeEndian.Uint64(b[8:])
		if k == 0 {
			break
		}
		if k == key {
			return v, true
		}
		b = b[16:]
	}
	return 0, false
}
