// Package e2e holds the bridge's end-to-end tests: the App and the command
// line against real servers that the tests start themselves (a private
// PostgreSQL cluster per test, in-process nats-servers), through crashes,
// restarts, faults and failovers. Every test proves what a user relies on:
// each committed change arrives exactly once, in commit order.
//
// harness_test.go has the shared environment: newEnv starts Postgres and
// NATS, env.config writes a bridge.yaml, env.start runs an App in the test's
// process, and the message helpers read back what the stream holds.
// Reading back is the tests' largest own cost under -race, so a check
// reads no more than it looks at: env.messages decodes every payload;
// env.rawMessages keeps them raw for a check of a few fields over many
// messages (eventKey takes them with fastjson); env.headers fetches no
// payload; env.messagesAfter reads only what came since; storedCount and
// env.waitStored count without reading.
//
// # Parallel and serial tests
//
// A test of this package runs in parallel with the others: its first line
// is `defer parallel(t)()` (sched_test.go), and at most -parallel of them
// run at once (GOMAXPROCS by default; scripts/test.sh asks for 4, since
// most of them wait on their servers, and passes its arguments on, so
// `./scripts/test.sh -parallel 8` raises it again; the last flag wins).
// The package bounds that itself, through a gate that TestMain hands
// -parallel to: go test would start the subtests (the kill loops' cases,
// the longest tests here) only after every top-level test, so the run
// ended with them alone for minutes. A test that takes a minute or more
// on a loaded machine starts with `defer parallelLong(t)()` instead and
// is admitted before the others waiting. No test calls t.Parallel()
// itself (TestEveryTestParallelOrSerial checks both).
// Each one has its own servers (newEnv: a Postgres cluster
// and a nats-server on ports of its own), its own files (t.TempDir) and
// its own names inside them, so the tests cannot meet. A kill -9 loop is
// parallel too: where its kills land is random anyway, and what it proves
// (every change once, in order) does not depend on when they land.
//
// A test stays serial (no `defer parallel(t)()`, and its doc comment says "Serial:"
// and why) when any of these holds:
//
//   - it measures or bounds how long something takes, or how often it
//     happens: takeover, failover and lease times, latency, heartbeats and
//     keep-alives;
//   - its sleeps must line up with a timeout of a server or of the bridge
//     (wal_sender_timeout, receive_timeout, a lease), or it stalls or cuts
//     a link or a server for a set time: other tests' load stretches the
//     one and not the other;
//   - it measures the test process itself (heap, goroutines, CPU, open
//     files), which the other tests in the process move;
//   - it changes what the whole process shares: t.Setenv (which Go refuses
//     in a parallel test; a variable that only a bridge process reads goes
//     into that process's environment instead: startProcEnv), the working
//     directory, signals, globals of a library.
//
// A deadline that only bounds a wait (require.Eventually, a token that
// must still be valid when the request arrives) may instead be given room
// for that load, saying so where it is set. When in doubt, a new test
// starts serial.
//
// Go runs every serial test of the package first, one at a time with no
// other test of this package running, and starts the parallel ones only
// after them, so a serial test has this test process to itself (tests of
// other packages may still run beside it: go test runs packages in
// parallel).
//
// A parallel test must not use a fixed port (take one from
// natsembed.Ports, testport.Claim or port 0), a fixed path outside its
// t.TempDir, or a package-level variable it writes (bridgeBinary's build,
// done once under a sync.Once, is the one shared thing). Subtests that each
// start their own environment may start with `defer parallel(t)()` too; subtests sharing
// their parent's servers stay sequential unless they only read.
//
// # When a kill test fails once in many runs
//
// KILL_FACTOR=10 runs the kill tests with ten times their kills and
// writes. E2E_PROC_LOGS=<dir> keeps the whole output of every bridge
// process a test starts (startProc), at debug level, in a file of its own
// under dir: each run's checkpoint, cursors and resume end ("run resumes"),
// the schema versions it registers, what it skipped as held. A duplicate
// in the stream fails with the messages around both copies and their
// fences, and SCHEMA_DEBUG=1 lists a schema test's stream and registry.
package e2e
