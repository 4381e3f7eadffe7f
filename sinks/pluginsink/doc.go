// Package pluginsink is the "plugin" sink: it runs an executable as a child
// process and delivers to it over gRPC (hashicorp/go-plugin), with the
// contract of package pluginv1. The plugin may be written in any language.
//
// Example (bridge.yaml):
//
//	sinks:
//	  file:
//	    type: plugin
//	    config:
//	      command: /usr/local/lib/bridge/go-sink   # required
//	      sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 # required
//	      args: ["--quiet"]
//	      env: { SINK_TOKEN: "${SINK_TOKEN}" }
//	      config: { path: /var/lib/cdc/changes.jsonl } # the plugin's own keys
//	      start_timeout: 10s
//	      restart_initial: 250ms
//	      restart_max: 10s
//	      max_crashes: 5
//
// The factory checks the executable against sha256, starts it, agrees the
// contract's major version in go-plugin's handshake, asks it to Describe
// itself and hands it its config block (its field errors come back as
// config errors under sinks.<name>.config.config). What Describe says
// fixes the delivery guarantee: a plugin that resumes makes the sink a
// sinks.Resumer (exactly once), one that dedupes a sinks.Deduplicator.
//
// A crash of the plugin (it exits, or its connection breaks) fails the
// Write under way with sinks.ErrNotConnected; the pipeline then calls
// Connect, which starts the plugin again after a backoff, and retries what
// was not acknowledged, with the same ids. Before that retry a plugin that
// resumes is asked what it holds past the last acknowledged Write (its
// cursor), and those changes are not written again. The same question
// precedes the Write after one that failed without saying which changes
// failed: one whose deadline passed or that was cancelled (the plugin may
// have carried it out all the same), or a whole-batch error. MaxCrashes crashes in a
// row without a successful Write end the sink with a permanent error that
// names the plugin and the fix.
package pluginsink
