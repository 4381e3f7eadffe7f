// Package fleet shares a bridge's sources among the processes of a fleet
// (`bridge run --fleet <name>`): each source is streamed by at most one
// member at a time, under a lease kept in a JetStream KV bucket
// (Bucket(fleet)), and the sources spread evenly over the live members
// (Plan).
//
// The bucket holds one key per member ("member.<id>", written every
// Lease/5 while the member runs) and one per source ("lease.<source>",
// value Lease: owner, epoch, renewal time). A member takes a free source
// with compare-and-set (create, or update at the revision it saw) and
// renews its leases with compare-and-set every Lease/5. Expiry is judged
// by each member on its own monotonic clock: another member's lease, or
// membership, is expired when its key kept the same revision for 3/4 of a
// Lease since this member saw it change. The owner stops a source that it
// could not renew Lease/2 after it sent its last successful renewal,
// before any other member can see the lease expire (the renewal reached
// them after it was sent), so clock skew between machines cannot make two
// writers, and a source whose owner died is taken over within the Lease of
// its last renewal (3/4 Lease, then the pipeline's start). The replication
// slot's single walsender and the checkpoint's compare-and-set remain the
// safety net behind the lease.
//
// A member that should hand a source over (another member joined, the
// plan moved it) drains it at a transaction boundary, so its checkpoint is
// saved, and then writes the lease as released (owner ""), which the new
// owner takes at once. A member that stops cleanly releases its leases
// and deletes its member key; one that dies leaves them to expire.
//
// The package knows the bridge only through the Runner interface, which
// starts and stops one source's pipeline (app.App implements it).
package fleet
