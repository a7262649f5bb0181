// Command pause is the sandbox process of the one-node cluster that make
// k8s-test runs (deploy/local/k8s-node.sh): it holds a pod's namespaces,
// reaps the orphans a shared PID namespace hands it, and exits on SIGTERM
// or SIGINT. No registry serves the usual pause image here, so the script
// builds this one, static, into an image of its own.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
