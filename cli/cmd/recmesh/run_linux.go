package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel send the child SIGTERM when recmesh run
// dies without stopping it (killed), so no mesh process is left behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
