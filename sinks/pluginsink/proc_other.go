//go:build !linux

package pluginsink

import "os/exec"

// dieWithParent does nothing here: a plugin may outlive a bridge that is
// killed (Linux only has PR_SET_PDEATHSIG).
func dieWithParent(*exec.Cmd) {}
