// Package snapshot reads the current rows of tables into the stream
// (docs/snapshots.md), in key order in bounded chunks, each chunk between a low and a high watermark
// written to the WAL (DBLog, as Debezium's incremental snapshots and Sequin's
// backfills do). A Manager wraps the
// pipeline's source (Wrap): it watches the stream for the
// watermarks, notes the keys of the rows that change between them, and at
// the high watermark puts the chunk's other rows into the stream as "read"
// changes. A row changed while its chunk was read is left out: the change
// itself, later in the stream, carries its newer state. So a consumer that
// applies the stream in order ends with every row's latest state, whatever
// writes run during the snapshot, and the stream never stops.
//
// Progress (per table: the last key whose chunk is checkpointed, rows,
// done) lives in the checkpoint bucket under "<bridge>.<source>.snapshot",
// written with compare-and-set once the chunk's position is checkpointed. A
// restart continues after the last checkpointed chunk. Read changes carry
// ids made of the snapshot id and the row's key, so a chunk read again
// after a crash is deduplicated by JetStream.
//
// Contract with the pipeline: ScheduleInitial runs before a new epoch's
// first checkpoint is saved; Wrap runs once per run, after the slot is the
// run's, and the pipeline reads, acks and closes the wrapper instead of the
// source. The wrapper's Ack saves snapshot progress only for chunks the
// checkpoint covers. ErrDone ends the pipeline without error (mode
// initial_only). `bridge snapshot` writes requests under RequestKey;
// `bridge status` reads ReadStatus.
package snapshot
