// Package cli is the bridge command line (cobra): run, validate, status,
// snapshot, resync, serve, plugins and version. Execute runs it and
// returns the exit status: 0 on success, 1 on failures (including every
// validation error), 2 on usage errors. Each command loads bridge.yaml
// through config.Load and app.New, so every command reports the same
// configuration errors; the commands' work lives in the packages they call
// (bridge/app, bridge/status, bridge/snapshot, bridge/serve).
package cli
