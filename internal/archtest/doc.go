// Package archtest checks the module's import rules (ARCHITECTURE.md,
// "Rules"): its test fails when a package imports what its layer must not.
package archtest
