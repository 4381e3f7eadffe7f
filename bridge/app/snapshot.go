package app

import (
	"context"
	"fmt"
	"strings"

	"github.com/bridgecdc/bridge/sources"
)

// CheckSnapshot checks a snapshot request before `bridge snapshot` queues
// it: source exists and can snapshot, and tables (schema.table; empty:
// every table the source streams) resolve as the bridge will resolve them
// when it takes the request: each exists, is streamed, and has a key to
// read it in order. It opens no replication connection; for a Postgres
// source it queries the catalog. It returns the tables the request covers.
func (a *App) CheckSnapshot(ctx context.Context, source string, tables []string) ([]string, error) {
	if _, ok := a.cfg.Sources[source]; !ok {
		return nil, fmt.Errorf("no source named %q in the configuration (sources: %s)", source, strings.Join(sortedKeys(a.cfg.Sources), ", "))
	}
	src, err := a.newSource(source)
	if err != nil {
		return nil, err
	}
	defer func() { _ = src.Close(context.WithoutCancel(ctx)) }()
	sn, ok := src.(sources.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("source %q (type %s) cannot snapshot", source, a.cfg.Sources[source].Type)
	}
	resolved, err := sn.SnapshotTables(ctx, tables)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(resolved))
	for i, t := range resolved {
		out[i] = t.Schema + "." + t.Table
	}
	return out, nil
}
