package config

// CheckStatus is the outcome of one check of `bridge validate --connect`.
type CheckStatus string

// The outcomes of a check.
const (
	// CheckOK: as the bridge needs it, or what `bridge run` will create.
	CheckOK CheckStatus = "ok"
	// CheckWarn: the bridge runs, but something deserves a look.
	CheckWarn CheckStatus = "warn"
	// CheckFail: `bridge run` would stop (or never deliver) because of it.
	CheckFail CheckStatus = "FAIL"
)

// Check is one line of `bridge validate --connect`: one thing checked
// against a server, without changing anything, and what was found.
type Check struct {
	Status CheckStatus
	// What names the object and what was found, e.g. `role "bridge" has
	// the REPLICATION privilege`.
	What string
	// Fix is what to do about a warning or a failure: SQL to run, a
	// command, a key to set. May be empty.
	Fix string
}
