// Command pipe is the benchmark's reference point: the straightforward
// Postgres → JetStream pipe a competent engineer writes in an afternoon with
// pglogrepl and the jetstream client, to compare the bridge with
// (docs/performance.md). It is not part of the product.
//
// It streams a pre-created pgoutput slot (proto_version 1, one publication)
// into a JetStream stream, one JSON message per row change on
// <prefix>.<schema>.<table>, each published asynchronously
// (PublishMsgAsync, at most 4096 pending) with a Nats-Msg-Id in the
// bridge's format, <producer>:<commit LSN as 16 hex digits>:<seq from 1>,
// so that JetStream's duplicate window drops what a restart publishes
// again. There is no fence (no expected last sequence) and no other
// header.
//
// A goroutine follows the acks in publish order and notes the end LSN of
// each transaction once every message before its commit is acknowledged.
// Every second it writes the last such LSN to a KV key (compare-and-set on
// the key's revision), without waiting for the messages still in flight,
// and only then confirms that LSN to Postgres; on SIGTERM or SIGINT it
// waits for every ack first. At start it resumes from the LSN in that key,
// if any.
//
//	pipe -dsn postgres://… -slot s -publication p -nats nats://… -stream S -prefix cdc -bucket b -key k
//
// Every flag can also be set by the PIPE_* variable named beside it in -h.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

type config struct {
	dsn, slot, publication     string
	natsURL, stream, prefix    string
	bucket, key, producer      string
	checkpointEvery, dupWindow time.Duration
}

func main() {
	var c config
	str := func(p *string, name, env, def, usage string) {
		if v := os.Getenv(env); v != "" {
			def = v
		}
		flag.StringVar(p, name, def, usage+" ("+env+")")
	}
	str(&c.dsn, "dsn", "PIPE_DSN", "", "Postgres connection string (replication=database is added)")
	str(&c.slot, "slot", "PIPE_SLOT", "", "existing pgoutput replication slot")
	str(&c.publication, "publication", "PIPE_PUBLICATION", "", "publication to stream")
	str(&c.natsURL, "nats", "PIPE_NATS", nats.DefaultURL, "NATS server URL")
	str(&c.stream, "stream", "PIPE_STREAM", "PIPE", "JetStream stream (created when missing)")
	str(&c.prefix, "prefix", "PIPE_PREFIX", "pipe", "subject prefix: messages go to <prefix>.<schema>.<table>")
	str(&c.bucket, "bucket", "PIPE_BUCKET", "pipe_checkpoints", "KV bucket of the checkpoint (created when missing)")
	str(&c.key, "key", "PIPE_KEY", "pipe", "KV key of the checkpoint")
	str(&c.producer, "producer", "PIPE_PRODUCER", "pipe", "producer part of the Nats-Msg-Id")
	flag.DurationVar(&c.checkpointEvery, "checkpoint-every", time.Second, "how often the checkpoint is written")
	flag.DurationVar(&c.dupWindow, "duplicate-window", 2*time.Minute, "the stream's duplicate window, when the pipe creates it")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("pipe: ")
	if c.dsn == "" || c.slot == "" || c.publication == "" {
		log.Fatal("-dsn, -slot and -publication are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// PIPE_CPUPROFILE: a CPU profile of the whole run, written at exit,
	// to see where the pipe's time goes when comparing it.
	if path := os.Getenv("PIPE_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if err := run(ctx, c); err != nil {
		pprof.StopCPUProfile() // a no-op without PIPE_CPUPROFILE
		log.Fatal(err)
	}
	log.Print("stopped")
}

// pipe is one run's state. Only the receive loop touches it, except pubErr.
type pipe struct {
	c    config
	conn *pgconn.PgConn
	js   jetstream.JetStream
	kv   jetstream.KeyValue
	rev  uint64 // the checkpoint key's revision; 0: no key yet

	rels       map[uint32]*pglogrepl.RelationMessage
	txLSN      pglogrepl.LSN // the current transaction's commit LSN (Begin.FinalLSN)
	txTime     time.Time
	seq        int
	acks       chan ack      // every publish's future and every commit, in order
	acked      atomic.Uint64 // end LSN of the last transaction whose messages are all acknowledged
	followed   chan struct{} // closed when the ack follower has read acks to its end
	checkpoint pglogrepl.LSN // what the KV key and Postgres hold

	mu     sync.Mutex
	pubErr error // the first asynchronous publish that failed
}

func run(ctx context.Context, c config) error {
	nc, err := nats.Connect(c.natsURL, nats.Name("pipe"))
	if err != nil {
		return fmt.Errorf("connecting to NATS at %s: %w", c.natsURL, err)
	}
	defer nc.Close()
	p := &pipe{c: c, rels: map[uint32]*pglogrepl.RelationMessage{}}
	p.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.pubErr == nil {
				p.pubErr = fmt.Errorf("publishing %s to %s: %w", m.Header.Get(jetstream.MsgIDHeader), m.Subject, err)
			}
		}))
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if _, err := p.js.Stream(ctx, c.stream); errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = p.js.CreateStream(ctx, jetstream.StreamConfig{Name: c.stream, Subjects: []string{c.prefix + ".>"},
			Storage: jetstream.FileStorage, Duplicates: c.dupWindow})
		if err != nil {
			return fmt.Errorf("creating stream %s: %w", c.stream, err)
		}
	} else if err != nil {
		return fmt.Errorf("looking up stream %s: %w", c.stream, err)
	}
	if p.kv, err = p.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: c.bucket, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("KV bucket %s: %w", c.bucket, err)
	}
	if e, err := p.kv.Get(ctx, c.key); err == nil {
		if p.checkpoint, err = pglogrepl.ParseLSN(string(e.Value())); err != nil {
			return fmt.Errorf("checkpoint %s/%s: %w", c.bucket, c.key, err)
		}
		p.rev = e.Revision()
		p.acked.Store(uint64(p.checkpoint))
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("reading checkpoint %s/%s: %w", c.bucket, c.key, err)
	}

	pc, err := pgconn.ParseConfig(c.dsn)
	if err != nil {
		return fmt.Errorf("parsing -dsn: %w", err)
	}
	pc.RuntimeParams["replication"] = "database"
	if p.conn, err = pgconn.ConnectConfig(ctx, pc); err != nil {
		return fmt.Errorf("connecting to Postgres: %w", err)
	}
	defer p.conn.Close(context.Background())
	err = pglogrepl.StartReplication(ctx, p.conn, c.slot, p.checkpoint, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + c.publication + "'"}})
	if err != nil {
		return fmt.Errorf("START_REPLICATION on slot %s: %w", c.slot, err)
	}
	log.Printf("streaming slot %s from %s into stream %s", c.slot, p.checkpoint, c.stream)

	p.acks, p.followed = make(chan ack, 8192), make(chan struct{})
	go p.follow()
	next := time.Now().Add(c.checkpointEvery)
	// One receive context per checkpoint interval, not one per message.
	until := func(t time.Time) (context.Context, context.CancelFunc) { return context.WithDeadline(ctx, t) }
	rctx, cancel := until(next)
	defer func() { cancel() }()
	for {
		if ctx.Err() != nil || time.Now().After(next) {
			if ctx.Err() != nil { // the last checkpoint covers everything published
				close(p.acks)
				<-p.followed
			}
			// A fresh context: the final checkpoint runs after the signal.
			cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := p.save(cctx)
			ccancel()
			if err != nil || ctx.Err() != nil {
				return err
			}
			next = time.Now().Add(c.checkpointEvery)
			cancel()
			rctx, cancel = until(next)
		}
		msg, err := p.conn.ReceiveMessage(rctx)
		if err != nil {
			if pgconn.Timeout(err) || ctx.Err() != nil {
				continue
			}
			return fmt.Errorf("receiving from slot %s: %w", c.slot, err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := p.copyData(ctx, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("slot %s: %s", c.slot, msg.Message)
		default:
			return fmt.Errorf("slot %s: unexpected message %T", c.slot, msg)
		}
	}
}

func (p *pipe) copyData(ctx context.Context, data []byte) error {
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parsing keepalive: %w", err)
		}
		if k.ReplyRequested {
			return p.confirm()
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parsing XLogData: %w", err)
		}
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return fmt.Errorf("parsing pgoutput message at %s: %w", x.WALStart, err)
		}
		return p.handle(ctx, m)
	}
	return nil
}

// change is the JSON message of one row change.
type change struct {
	Op         string         `json:"op"`
	Schema     string         `json:"schema"`
	Table      string         `json:"table"`
	CommitLSN  string         `json:"commit_lsn"`
	CommitTime time.Time      `json:"commit_time"`
	Row        map[string]any `json:"row"` // the new row; for a delete, the old key (or row)
}

func (p *pipe) handle(ctx context.Context, m pglogrepl.Message) error {
	var op string
	var relID uint32
	var tuple *pglogrepl.TupleData
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		p.rels[m.RelationID] = m
		return nil
	case *pglogrepl.BeginMessage:
		p.txLSN, p.txTime, p.seq = m.FinalLSN, m.CommitTime, 0
		return nil
	case *pglogrepl.CommitMessage:
		p.acks <- ack{end: m.TransactionEndLSN}
		return nil
	case *pglogrepl.InsertMessage:
		op, relID, tuple = "insert", m.RelationID, m.Tuple
	case *pglogrepl.UpdateMessage:
		op, relID, tuple = "update", m.RelationID, m.NewTuple
	case *pglogrepl.DeleteMessage:
		op, relID, tuple = "delete", m.RelationID, m.OldTuple
	default:
		return nil // truncate, type, origin, message: not streamed
	}
	rel, ok := p.rels[relID]
	if !ok {
		return fmt.Errorf("change for unknown relation %d in transaction %s", relID, p.txLSN)
	}
	row := map[string]any{}
	if tuple != nil {
		for i, col := range tuple.Columns {
			if i >= len(rel.Columns) {
				break
			}
			switch col.DataType {
			case 'n':
				row[rel.Columns[i].Name] = nil
			case 't':
				row[rel.Columns[i].Name] = string(col.Data)
			} // 'u': an unchanged TOAST value, not sent
		}
	}
	body, err := json.Marshal(change{Op: op, Schema: rel.Namespace, Table: rel.RelationName,
		CommitLSN: p.txLSN.String(), CommitTime: p.txTime, Row: row})
	if err != nil {
		return fmt.Errorf("encoding %s on %s.%s: %w", op, rel.Namespace, rel.RelationName, err)
	}
	p.seq++
	msg := nats.NewMsg(p.c.prefix + "." + rel.Namespace + "." + rel.RelationName)
	msg.Data = body
	msg.Header.Set(jetstream.MsgIDHeader, p.c.producer+":"+cdc.LSN(p.txLSN).Hex()+":"+strconv.Itoa(p.seq))
	for {
		f, err := p.js.PublishMsgAsync(msg)
		if err == nil {
			p.acks <- ack{f: f}
		}
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) && ctx.Err() == nil {
			continue // 4096 pending for longer than the stall wait: try again
		}
		if err != nil {
			return fmt.Errorf("publishing to %s: %w", msg.Subject, err)
		}
		return nil
	}
}

// ack is one entry of the ack follower's queue: a publish's future, or
// (f nil) the end of a transaction whose messages were all queued before.
type ack struct {
	f   jetstream.PubAckFuture
	end pglogrepl.LSN
}

// follow reads p.acks in order until it is closed: it waits for each
// publish's ack and, at each transaction's end, records that every message
// of it and before it is acknowledged. After the first failed publish it
// records nothing more (save reports the failure).
func (p *pipe) follow() {
	defer close(p.followed)
	failed := false
	for a := range p.acks {
		if a.f == nil {
			if !failed {
				p.acked.Store(uint64(a.end))
			}
			continue
		}
		select {
		case <-a.f.Ok():
		case err := <-a.f.Err():
			failed = true
			p.mu.Lock()
			if p.pubErr == nil {
				p.pubErr = fmt.Errorf("publishing %s to %s: %w", a.f.Msg().Header.Get(jetstream.MsgIDHeader), a.f.Msg().Subject, err)
			}
			p.mu.Unlock()
		}
	}
}

// save writes the end LSN of the last transaction whose messages are all
// acknowledged to the KV key (create, then compare-and-set on its
// revision) and confirms it to Postgres. A failed publish fails it: the
// pipe exits without moving the checkpoint, and a restart publishes again
// from it.
func (p *pipe) save(ctx context.Context) error {
	lsn := pglogrepl.LSN(p.acked.Load())
	p.mu.Lock()
	err := p.pubErr
	p.mu.Unlock()
	if err != nil {
		return err
	}
	if lsn != p.checkpoint {
		var rev uint64
		if p.rev == 0 {
			rev, err = p.kv.Create(ctx, p.c.key, []byte(lsn.String()))
		} else {
			rev, err = p.kv.Update(ctx, p.c.key, []byte(lsn.String()), p.rev)
		}
		if err != nil {
			return fmt.Errorf("writing checkpoint %s to %s/%s: %w", lsn, p.c.bucket, p.c.key, err)
		}
		p.rev, p.checkpoint = rev, lsn
	}
	return p.confirm()
}

// confirm tells Postgres the slot may advance to the checkpoint.
func (p *pipe) confirm() error {
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), p.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: p.checkpoint})
	if err != nil {
		return fmt.Errorf("confirming %s on slot %s: %w", p.checkpoint, p.c.slot, err)
	}
	return nil
}
