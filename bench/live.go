package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// WriteAtRate commits single-row transactions at rate per second for d, on
// a connection of its own with synchronous_commit on (the cluster's default
// here is off, which lets commits wait up to wal_writer_delay before the
// walsender may send them; a live latency figure must not include that).
// It returns the number committed, the time it took and the CPU time of the
// writer's backend.
func (p *PG) WriteAtRate(ctx context.Context, rate int, d time.Duration) (int, time.Duration, time.Duration, error) {
	c, err := pgx.Connect(ctx, p.Server.DSN(""))
	if err != nil {
		return 0, 0, 0, err
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		return 0, 0, 0, err
	}
	var pid int
	if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, 0, 0, err
	}
	before, _ := ReadCPU(pid)
	pad := strings.Repeat("x", p.pad)
	total := int(float64(rate) * d.Seconds())
	start := time.Now()
	for i := 0; i < total; i++ {
		if wait := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); wait > 0 {
			time.Sleep(wait)
		}
		if _, err := c.Exec(ctx, `INSERT INTO bench (n, pad) VALUES ($1, $2)`, i, pad); err != nil {
			return i, time.Since(start), 0, fmt.Errorf("insert %d: %w", i, err)
		}
	}
	took := time.Since(start)
	after, _ := ReadCPU(pid)
	return total, took, after.Self - before.Self, nil
}
