package pluginsink

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the plugin get SIGKILL when the bridge dies, even by
// SIGKILL, so no orphan outlives it (Linux: PR_SET_PDEATHSIG).
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
