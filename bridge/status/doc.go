// Package status answers `bridge status`: for each source, its replication
// slot, its checkpoint and snapshot progress in the KV bucket, the streams
// its routes reach and the lag, read from Postgres and NATS directly, so it
// works while the bridge is down; and, when the bridge's instances answer
// on its control endpoint (bridge/control), the running state of each
// source (Report.Merge): streaming, paused, standby..., its last error and
// configuration revision. Report.Via says which path was used. Query never
// fails as a whole: each query that fails is listed in its source's Errors
// and Report.OK is false. The JSON field names of Report are stable.
package status
