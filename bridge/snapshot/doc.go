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
// done, and how far the chunks sent reach) lives in the checkpoint bucket
// under "<bridge>.<source>.snapshot", written with compare-and-set. A
// restart continues after the last checkpointed chunk. Read changes carry
// ids made of the snapshot id and the row's key, the same in every run; a
// resumed run leaves out, per sink, the rows the sink holds after the
// state's ScanFrom, which stays at or before every stored read that a run
// may read again (Run.ScanFrom, Table.Sent, Checkpointed). So each read is
// stored once beyond the duplicate window too (docs/exactly-once.md).
//
// Contract with the pipeline: ScheduleInitial runs before a new epoch's
// first checkpoint is saved; Wrap runs once per run, after the slot is the
// run's, and the pipeline reads, acks and closes the wrapper instead of the
// source. After every checkpoint it saves, the pipeline calls the
// wrapper's Checkpointed with its LSN and sink cursors: that counts the
// chunks the checkpoint covers. The writer leaves out, per sink, the reads
// the HeldFunc found (Held.Take). ErrDone ends the pipeline without error
// (mode initial_only). `bridge snapshot` writes requests under RequestKey;
// `bridge status` reads ReadStatus.
package snapshot
