package steering

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The frontend's user under compose (compose.yaml): not root, and with
// deploy/compose.ebpf.yaml CAP_BPF as its only capability.
const (
	frontendUID = 65533
	capBPF      = 39 // CAP_BPF, Linux 5.8
)

// helperEnv makes the test binary, run as a child, open a group in the
// directory it names, join it with a listener and print the outcome
// instead of running the tests.
const helperEnv = "RECMESH_STEERING_OPEN_HELPER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		fmt.Printf("%s %s\n", effectiveCaps(), openAndJoin(dir))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// effectiveCaps is this process's CapEff line of /proc/self/status, so
// the test sees what the helper ran with, not what it meant to give.
func effectiveCaps() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "CapEff: unknown"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, "CapEff:") {
			return strings.Join(strings.Fields(line), " ")
		}
	}
	return "CapEff: unknown"
}

// openAndJoin is the helper: Open, then Join with a listening socket, the
// two steps a frontend takes with whatever privileges it was given.
func openAndJoin(dir string) string {
	g, err := Open(dir)
	if err != nil {
		return "error: " + err.Error()
	}
	defer g.Close()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "error: " + err.Error()
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return "error: " + err.Error()
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return "error: " + err.Error()
	}
	if err := unix.Listen(fd, 8); err != nil {
		return "error: " + err.Error()
	}
	m, err := g.Join(fd)
	if err != nil {
		return "error: " + err.Error()
	}
	m.Leave()
	return fmt.Sprintf("ok migrates=%v", g.Migrates())
}

// TestOpenWithOnlyCAPBPF runs Open and Join as compose runs a frontend
// with eBPF steering: another user than root, CAP_BPF its only capability,
// on a bpffs mounted root-only (0700) as systemd mounts /sys/fs/bpf. Given
// a pin directory of its own it steers; without CAP_BPF, or without that
// directory, it fails with an error that names what to grant or create.
// Needs root, to mount the bpffs and start the helper as another user.
func TestOpenWithOnlyCAPBPF(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("RECMESH_REQUIRE_EBPF") != "" {
			t.Fatal("eBPF steering required here, but this test mounts a bpffs and starts a process as another user: run it as root")
		}
		t.Skip("mounts a bpffs and starts a process as another user: needs root")
	}
	testGroup(t) // skips (or, under RECMESH_REQUIRE_EBPF, fails) where eBPF cannot run at all

	root := t.TempDir()
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := copyTestBinary(t, root)
	bpffs := filepath.Join(root, "bpf")
	if err := os.Mkdir(bpffs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		if os.Getenv("RECMESH_REQUIRE_EBPF") != "" {
			t.Fatalf("eBPF steering required here, but a bpffs cannot be mounted: %v", err)
		}
		t.Skipf("cannot mount a bpffs here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	// What deploy/compose.ebpf.yaml arranges: a directory on the bpffs
	// owned by the frontend's user, bound where that user can reach it.
	prepared := filepath.Join(bpffs, "recmesh")
	if err := os.Mkdir(prepared, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(prepared, frontendUID, frontendUID); err != nil {
		t.Fatal(err)
	}
	bound := filepath.Join(root, "steering")
	if err := os.Mkdir(bound, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(prepared, bound, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s: %v", prepared, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bound, unix.MNT_DETACH) })

	for _, tc := range []struct {
		name string
		caps []uintptr
		dir  string
		want string
	}{
		{name: "CAP_BPF and a directory of its own", caps: []uintptr{capBPF}, dir: filepath.Join(bound, "8001"), want: "ok migrates="},
		{name: "CAP_BPF, its directory behind the root-only bpffs root", caps: []uintptr{capBPF}, dir: filepath.Join(prepared, "8001"),
			want: fmt.Sprintf("permission denied (this user needs a directory of its own on the bpffs, and a path to it: install -d -o %d -m 0700", frontendUID)},
		{name: "no capability", dir: filepath.Join(bound, "8002"), want: "this process needs CAP_BPF (or root)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runAsFrontendUser(t, bin, tc.dir, tc.caps)
			var mask uint64
			for _, c := range tc.caps {
				mask |= 1 << c
			}
			if caps := fmt.Sprintf("CapEff: %016x ", mask); !strings.HasPrefix(got, caps) {
				t.Fatalf("helper printed %q, want it to run with %q only", got, caps)
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("helper printed %q, want it to contain %q", got, tc.want)
			}
		})
	}
}

// runAsFrontendUser runs the helper against dir as frontendUID with caps
// as its only capabilities (ambient, so they survive the change of user
// and the exec) and returns what it printed.
func runAsFrontendUser(t *testing.T, bin, dir string, caps []uintptr) string {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: frontendUID, Gid: frontendUID},
		AmbientCaps: caps,
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out.String())
	}
	return strings.TrimSpace(out.String())
}

// copyTestBinary copies the test binary into dir, where other users can
// run it: go test builds it in a directory only this user may enter.
func copyTestBinary(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "steering.test")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}
