package app

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/checkpoint"
	"github.com/bridgecdc/bridge/bridge/snapshot"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/sources"
)

// CheckSnapshot checks a snapshot request before `bridge snapshot` queues
// it: source exists and can snapshot, and tables (schema.table; empty:
// every table the source streams) resolve as the bridge will resolve them
// when it takes the request: each exists, is streamed, and has a key to
// read it in order. A where (sources.ParseWhere's syntax; "" for none)
// must parse, the source must be able to filter, and it must apply to
// every table (its columns exist, its literals convert). It opens no
// replication connection; for a Postgres source it queries the catalog.
// It returns the tables the request covers.
func (a *App) CheckSnapshot(ctx context.Context, source string, tables []string, where string) ([]string, error) {
	return a.checkSnapshot(ctx, a.cfg, source, tables, where)
}

func (a *App) checkSnapshot(ctx context.Context, cfg *config.Config, source string, tables []string, where string) ([]string, error) {
	if _, ok := cfg.Sources[source]; !ok {
		return nil, fmt.Errorf("no source named %q in the configuration (sources: %s)", source, strings.Join(sortedKeys(cfg.Sources), ", "))
	}
	conds, err := sources.ParseWhere(where)
	if err != nil {
		return nil, err
	}
	select {
	case a.snapChecks <- struct{}{}:
		defer func() { <-a.snapChecks }()
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the snapshot requests checked before this one: %w", ctx.Err())
	}
	src, err := a.newSourceFrom(cfg, source)
	if err != nil {
		return nil, err
	}
	defer func() { _ = src.Close(context.WithoutCancel(ctx)) }()
	sn, ok := src.(sources.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("source %q (type %s) cannot snapshot", source, cfg.Sources[source].Type)
	}
	resolved, err := sn.SnapshotTables(ctx, tables)
	if err != nil {
		return nil, err
	}
	if len(conds) > 0 {
		wc, ok := sn.(sources.WhereChecker)
		if !ok {
			return nil, fmt.Errorf("source %q (type %s) cannot read a snapshot with a where", source, cfg.Sources[source].Type)
		}
		for _, t := range resolved {
			t.Where = conds
			if err := wc.CheckWhere(ctx, t); err != nil {
				return nil, err
			}
		}
	}
	out := make([]string, len(resolved))
	for i, t := range resolved {
		out[i] = t.Schema + "." + t.Table
	}
	return out, nil
}

// RequestSnapshot checks a snapshot request (CheckSnapshot, against the
// configuration in effect) and queues it in the checkpoint bucket through
// js, where the bridge streaming source takes it within
// snapshot.request_poll (a stopped one at its next start). It returns the
// request's id and the tables it covers (empty tables: every table, and
// the request keeps it so). A where the tables refuse is an error before
// anything is queued.
func (a *App) RequestSnapshot(ctx context.Context, js jetstream.JetStream, source string, tables []string, where string) (string, []string, error) {
	a.mu.Lock()
	cfg := a.current()
	a.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	resolved, err := a.checkSnapshot(cctx, cfg, source, tables, where)
	cancel()
	if err != nil {
		return "", nil, err
	}
	if len(resolved) == 0 {
		return "", nil, fmt.Errorf("source %s streams no table yet", source)
	}
	if len(tables) > 0 {
		tables = resolved // as checked: a bare name is public's
	}
	if _, err := checkpoint.Open(ctx, js, cfg.Checkpoint.Bucket, cfg.Checkpoint.Replicas); err != nil {
		return "", nil, err
	}
	kv, err := js.KeyValue(ctx, cfg.Checkpoint.Bucket)
	if err != nil {
		return "", nil, fmt.Errorf("opening checkpoint bucket %q: %w", cfg.Checkpoint.Bucket, err)
	}
	if where != "" {
		conds, _ := sources.ParseWhere(where)
		where = sources.FormatWhere(conds) // one spelling in the bucket and the logs
	}
	req := snapshot.Request{ID: "r" + checkpoint.NewEpoch(), Tables: tables, Where: where, Reason: "request", At: time.Now().UTC()}
	b, _ := json.Marshal(req)
	if _, err := kv.Create(ctx, snapshot.RequestKey(cfg.Name, source, req.ID), b); err != nil {
		return "", nil, fmt.Errorf("writing the snapshot request to bucket %q: %w", cfg.Checkpoint.Bucket, err)
	}
	return req.ID, resolved, nil
}
