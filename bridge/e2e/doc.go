// Package e2e holds the bridge's end-to-end tests: the App and the command
// line against real servers that the tests start themselves (a private
// PostgreSQL cluster per test, in-process nats-servers), through crashes,
// restarts, faults and failovers. Every test proves what a user relies on:
// each committed change arrives exactly once, in commit order.
//
// harness_test.go has the shared environment: newEnv starts Postgres and
// NATS, env.config writes a bridge.yaml, env.start runs an App in the test's
// process, and the message helpers read back what the stream holds.
package e2e
