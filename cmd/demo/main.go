// Command demo shows the bridge end to end on one machine: it starts a
// throwaway PostgreSQL, runs the bridge with its embedded NATS server, makes
// a few writes, prints the JetStream messages they became, and cleans up.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/app"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/internal/pgtest"
	_ "github.com/bridgecdc/bridge/plugins"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "bridge-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	step("starting a throwaway PostgreSQL (wal_level=logical)")
	pg, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		return err
	}
	defer pg.Destroy()
	if err := pg.Exec(ctx, "", `CREATE TABLE orders (id serial PRIMARY KEY, customer text NOT NULL, total numeric(10,2), tags text[], placed_at timestamptz DEFAULT now())`); err != nil {
		return err
	}

	cfgPath, dataDir := filepath.Join(dir, "bridge.yaml"), filepath.Join(dir, "data")
	yaml := fmt.Sprintf(`name: demo
data_dir: %s
nats:
  embedded: { port: -1 }   # no url: the bridge runs NATS with JetStream in-process
http: { listen: "127.0.0.1:0" }  # /metrics, /livez, /readyz (a free port for the demo)
sources:
  shop:
    type: pgoutput
    config:
      dsn: %s
      message_prefixes: ["demo"]
sinks:
  jetstream:
    type: nats_jetstream
    config: { stream: CDC, subjects: ["cdc.>"] }
routes:
  - sinks: [jetstream]
    subject: "cdc.{{.Source}}.{{.Schema}}.{{.Table}}"
`, dataDir, pg.DSN(""))
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o644); err != nil {
		return err
	}
	fmt.Printf("\n--- bridge.yaml ---\n%s-------------------\n\n", yaml)

	step("starting the bridge with embedded NATS")
	cfg, err := config.Load(cfgPath, app.ConfigOptions()...)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	br, err := app.New(cfg, app.WithLogger(log))
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	if err := br.Start(runCtx); err != nil {
		stop()
		return err
	}
	done := make(chan error, 1)
	go func() { done <- br.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	for !br.Pipelines()[0].Ready() {
		select {
		case err := <-done:
			return fmt.Errorf("bridge stopped: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}

	step("writing to PostgreSQL")
	writes := []string{
		`INSERT INTO orders (customer, total, tags) VALUES ('ada', 42.50, '{new,vip}'), ('linus', 9.99, '{}')`,
		`UPDATE orders SET total = 45.00 WHERE customer = 'ada'`,
		`BEGIN; DELETE FROM orders WHERE customer = 'linus'; SELECT pg_logical_emit_message(true, 'demo', '{"note":"refund issued"}'); COMMIT`,
		`TRUNCATE orders`,
	}
	for _, w := range writes {
		fmt.Printf("  sql> %s\n", w)
		if err := pg.Exec(ctx, "", w); err != nil {
			return err
		}
	}

	step("reading the JetStream stream CDC")
	// The embedded server admits only holders of the key the bridge keeps
	// in data_dir (the nats CLI: nats --nkey <data_dir>/embedded-nats.nk).
	key, err := nats.NkeyOptionFromSeed(filepath.Join(dataDir, natsembed.KeyFile))
	if err != nil {
		return err
	}
	nc, err := nats.Connect(br.NATSURL(), key)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, "CDC")
	if err != nil {
		return err
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	const want = 6
	for got := 0; got < want; {
		m, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			return fmt.Errorf("waiting for message %d of %d: %w", got+1, want, err)
		}
		got++
		md, _ := m.Metadata()
		fmt.Printf("\n#%d  subject %s\n", md.Sequence.Stream, m.Subject())
		keys := make([]string, 0, len(m.Headers()))
		for k := range m.Headers() {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Printf("    %s: %s\n", k, m.Headers().Get(k))
		}
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, m.Data(), "    ", "  "); err != nil {
			return err
		}
		fmt.Printf("    %s\n", pretty.String())
	}
	// The checkpoint follows within checkpoint.interval (1s by default).
	for deadline := time.Now().Add(5 * time.Second); br.Pipelines()[0].Checkpointed() == 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("\nEvery committed change arrived once, in commit order. Checkpoint (KV bucket bridge_checkpoints, key demo.shop): %s.\n", br.Pipelines()[0].Checkpointed())
	return nil
}

func step(s string) { fmt.Printf("==> %s\n", s) }
