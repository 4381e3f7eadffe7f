package natsjs

import (
	"context"
	"errors"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
)

const producer = "shop.main.e1"

func TestRegistered(t *testing.T) {
	p, err := sinks.Default.Lookup("nats_jetstream")
	require.NoError(t, err)
	require.NotNil(t, p.New)
	require.Equal(t, DefaultConfig(), p.Config)
	require.NotEmpty(t, p.Doc)
}

func TestConfig(t *testing.T) {
	env := sinks.Env{Name: "main", NATS: sinks.NATSEnv{URL: "nats://env:4222", NATSClient: config.NATSClient{User: "u", Password: "p"}}}

	t.Run("defaults", func(t *testing.T) {
		sk, err := New(decoderFor(map[string]any{"stream": "CDC"}), env)
		require.NoError(t, err)
		cfg := sk.(*Sink).cfg
		want := DefaultConfig()
		want.Stream, want.URL = "CDC", "nats://env:4222"
		require.Equal(t, want, cfg)
		conn := sk.(*Sink).nconn
		require.Equal(t, "nats://env:4222", conn.URL)
		require.Equal(t, "u", conn.User)
		require.Equal(t, "p", conn.Password)
	})
	t.Run("own url gets no env credentials", func(t *testing.T) {
		sk, err := New(decoderFor(map[string]any{"stream": "CDC", "url": "nats://other:4222"}), env)
		require.NoError(t, err)
		cfg := sk.(*Sink).cfg
		require.Equal(t, "nats://other:4222", cfg.URL)
		require.Empty(t, sk.(*Sink).nconn.User)
		require.Empty(t, sk.(*Sink).nconn.Password)
	})
	t.Run("subjects replace the default", func(t *testing.T) {
		sk, err := New(decoderFor(map[string]any{"stream": "CDC", "subjects": []any{"a.>", "b.*"}}), env)
		require.NoError(t, err)
		require.Equal(t, []string{"a.>", "b.*"}, sk.(*Sink).cfg.Subjects)
	})

	for _, tc := range []struct {
		name string
		raw  map[string]any
		path string
		msg  string
	}{
		{"stream missing", map[string]any{}, "stream", "must be set"},
		{"stream invalid", map[string]any{"stream": "a.b"}, "stream", "not a valid stream name"},
		{"subject invalid", map[string]any{"stream": "S", "subjects": []any{"ok.>", "a..b"}}, "subjects[1]", "not a valid subject"},
		{"subject wildcard misplaced", map[string]any{"stream": "S", "subjects": []any{"a.>.b"}}, "subjects[0]", "not a valid subject"},
		{"replicas", map[string]any{"stream": "S", "replicas": 7}, "replicas", "between 1 and 5"},
		{"duplicate window", map[string]any{"stream": "S", "duplicate_window": "0s"}, "duplicate_window", "must be > 0"},
		{"max pending", map[string]any{"stream": "S", "max_pending": 0}, "max_pending", "must be > 0"},
		{"ack timeout", map[string]any{"stream": "S", "ack_timeout": "-1s"}, "ack_timeout", "must be > 0"},
		{"password without user", map[string]any{"stream": "S", "password": "secret"}, "user", "must be set"},
		{"client certificate without its key", map[string]any{"stream": "S", "tls": map[string]any{"cert_file": "/c.crt"}}, "tls.key_file", "must be set with cert_file"},
		{"CA file that does not exist", map[string]any{"stream": "S", "tls": map[string]any{"ca_file": "/nonexistent/ca.crt"}}, "tls.ca_file", "open /nonexistent/ca.crt: no such file or directory"},
		{"creds and nkey seed", map[string]any{"stream": "S", "creds": "/a.creds", "nkey_seed_file": "/a.nk"}, "nkey_seed_file", "not both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(decoderFor(tc.raw), env)
			var fe *config.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, tc.path, fe.Path)
			require.Contains(t, fe.Msg, tc.msg)
			require.NotContains(t, err.Error(), "secret")
		})
	}
	t.Run("unknown key", func(t *testing.T) {
		_, err := New(decoderFor(map[string]any{"stream": "S", "subjcet": "x"}), env)
		require.ErrorContains(t, err, "subjcet")
	})
}

// exampleCreds writes a .creds file that parses, for a doc example whose
// creds key names a file that exists only in production (Validate reads
// it), and returns its path.
func exampleCreds(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bridge.creds")
	require.NoError(t, os.WriteFile(p, natsembed.CredsT(t), 0o600))
	return p
}

// TestDocExample decodes the YAML example of doc.go.
func TestDocExample(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	var lines []string
	for _, l := range strings.Split(f.Doc.Text(), "\n") {
		if strings.HasPrefix(l, "\t") {
			lines = append(lines, strings.TrimPrefix(l, "\t"))
		}
	}
	require.NotEmpty(t, lines, "doc.go has no indented YAML example")
	var doc struct {
		Sinks map[string]struct {
			Type   string         `yaml:"type"`
			Config map[string]any `yaml:"config"`
		} `yaml:"sinks"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(strings.Join(lines, "\n")), &doc))
	main := doc.Sinks["main"]
	require.Equal(t, "nats_jetstream", main.Type)
	require.Equal(t, "/etc/bridge/bridge.creds", main.Config["creds"])
	main.Config["creds"] = exampleCreds(t)
	sk, err := New(decoderFor(main.Config), sinks.Env{})
	require.NoError(t, err)
	cfg := sk.(*Sink).cfg
	require.Equal(t, "CDC_SHOP", cfg.Stream)
	require.Equal(t, []string{"cdc.shop.>"}, cfg.Subjects)
	require.Equal(t, 3, cfg.Replicas)
	require.Equal(t, 2*time.Minute, cfg.DuplicateWindow)
	require.Equal(t, 10*time.Second, cfg.AckTimeout)
}

func TestSubjectMatching(t *testing.T) {
	for _, tc := range []struct {
		filter, subj string
		want         bool
	}{
		{"cdc.>", "cdc.a", true},
		{"cdc.>", "cdc.a.b.c", true},
		{"cdc.>", "cdc", false},
		{"cdc.*", "cdc.a", true},
		{"cdc.*", "cdc.a.b", false},
		{"cdc.*.x", "cdc.a.x", true},
		{"cdc.*.x", "cdc.a.y", false},
		{"a.b", "a.b", true},
		{"a.b", "a.bc", false},
		{"a", "a.b", false},
		{">", "anything.at.all", true},
	} {
		require.Equal(t, tc.want, matchSubject(tc.filter, tc.subj), "%s ~ %s", tc.filter, tc.subj)
	}
}

func TestWriteInOrderWithHeaders(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, nil)
	require.NoError(t, s.Connect(t.Context()), "Connect is idempotent")

	batch := txs(producer, 0x16B3700, 3, 4)
	msg := cdc.Change{Producer: producer, CommitLSN: 0x16B3A00, Seq: 0, TxSize: 1, Xid: 2000,
		Op: cdc.OpMessage, Prefix: "app", Subject: "cdc.main._message.app", Payload: []byte("hello")}
	batch = append(batch, msg)
	require.Empty(t, s.Cursor())
	require.NoError(t, s.Write(t.Context(), batch))

	got := stored(t, srv.URL(), "CDC")
	require.Len(t, got, len(batch))
	for i, m := range got {
		c := &batch[i]
		require.Equal(t, c.Subject, m.Subject)
		require.Equal(t, c.Payload, m.Data)
		h := m.Header
		require.Equal(t, c.ID(), h.Get("Nats-Msg-Id"))
		require.Equal(t, strconv.Itoa(int(c.TxSize)), h.Get("Bridge-Tx-Size"))
		require.Equal(t, string(c.Op), h.Get("Bridge-Op"))
		keys := []string{"Nats-Msg-Id", "Bridge-Op", "Bridge-Tx-Size"}
		if c.Op == cdc.OpMessage {
			require.NotContains(t, h, "Bridge-Table")
		} else {
			require.Equal(t, "public.orders", h.Get("Bridge-Table"))
			require.Equal(t, c.Headers["traceparent"], h.Get("traceparent"), "lowercase key kept as given")
			require.NotContains(t, h, "Traceparent")
			keys = append(keys, "Bridge-Table", "traceparent")
		}
		// The fence: the first message follows the stream's last
		// sequence, every other one the message before it.
		if i == 0 {
			require.Equal(t, "0", h.Get("Nats-Expected-Last-Sequence"))
			keys = append(keys, "Nats-Expected-Last-Sequence")
		} else {
			require.Equal(t, batch[i-1].ID(), h.Get("Nats-Expected-Last-Msg-Id"))
			keys = append(keys, "Nats-Expected-Last-Msg-Id")
		}
		require.ElementsMatch(t, keys, slices.Collect(maps.Keys(h)), "nothing else: the rest of the change is in the payload")
	}
	require.Equal(t, strconv.FormatUint(got[len(got)-1].Sequence, 10), s.Cursor())
}

func TestReservedHeadersDropped(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, nil)
	batch := txs(producer, 0x100, 1, 2)
	batch[0].Headers = map[string]string{
		"traceparent":  "00-1-2-01",
		"Nats-Rollup":  "all", // would wipe the stream
		"Nats-Msg-Id":  "forged",
		"x-bad":        "a\r\nNats-Rollup: all",
		"Bridge-Op":    "forged",
		"x-app-header": "kept",
	}
	require.NoError(t, s.Write(t.Context(), batch))
	got := stored(t, srv.URL(), "CDC")
	require.Len(t, got, 2)
	h := got[0].Header
	require.Equal(t, "00-1-2-01", h.Get("traceparent"))
	require.Equal(t, "kept", h.Get("x-app-header"))
	require.Equal(t, batch[0].ID(), h.Get("Nats-Msg-Id"))
	require.Equal(t, "insert", h.Get("Bridge-Op"))
	require.NotContains(t, h, "Nats-Rollup")
	require.NotContains(t, h, "x-bad")
}

func TestDedupe(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, nil)
	batch := txs(producer, 0x1000, 5, 10)
	require.NoError(t, s.Write(t.Context(), batch))
	cur := s.Cursor()
	require.NoError(t, s.Write(t.Context(), batch), "a replay is acked as duplicates")
	require.Equal(t, ids(batch), storedIDs(t, srv.URL(), "CDC"))
	require.Equal(t, cur, s.Cursor(), "duplicate acks carry the original sequences")

	// A second sink instance (a restarted bridge) is deduplicated too.
	s2 := connected(t, srv, nil)
	require.NoError(t, s2.Write(t.Context(), batch[10:30]))
	require.Equal(t, ids(batch), storedIDs(t, srv.URL(), "CDC"))
}

func TestDelivered(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, nil)
	a := txs(producer, 0x1000, 10, 3) // 30 changes
	b := txs("shop.other.e1", 0x1000, 4, 3)

	all, err := s.Delivered(t.Context(), producer, "")
	require.NoError(t, err)
	require.Empty(t, all, "empty stream")

	require.NoError(t, s.Write(t.Context(), a[:9]))
	checkpoint := s.Cursor() // the pipeline stores this with the LSN of a[8]
	require.NoError(t, s.Write(t.Context(), b[:6]))
	require.NoError(t, s.Write(t.Context(), a[9:14])) // crash: half of a[12:15]'s transaction
	require.NoError(t, s.Write(t.Context(), b[6:]))

	got, err := s.Delivered(t.Context(), producer, checkpoint)
	require.NoError(t, err)
	require.Equal(t, positions(a[9:14]), got)

	got, err = s.Delivered(t.Context(), producer, "")
	require.NoError(t, err)
	require.Equal(t, positions(a[:14]), got)

	got, err = s.Delivered(t.Context(), "shop.other.e1", "")
	require.NoError(t, err)
	require.Equal(t, positions(b), got)

	got, err = s.Delivered(t.Context(), "shop.main.e2", "")
	require.NoError(t, err)
	require.Empty(t, got, "another epoch of the same source")

	got, err = s.Delivered(t.Context(), producer, s.Cursor())
	require.NoError(t, err)
	require.Empty(t, got, "nothing after the last ack")

	st, err := s.js.Stream(t.Context(), "CDC")
	require.NoError(t, err)
	require.Zero(t, st.CachedInfo().State.Consumers, "Delivered deletes its consumer")

	_, err = s.Delivered(t.Context(), producer, "not-a-number")
	require.ErrorContains(t, err, "invalid cursor")

	t.Run("after a purge", func(t *testing.T) {
		purge(t, s, "CDC")
		got, err := s.Delivered(t.Context(), producer, checkpoint)
		require.NoError(t, err)
		require.Empty(t, got)
		require.NoError(t, s.Write(t.Context(), a[14:20]))
		got, err = s.Delivered(t.Context(), producer, checkpoint) // older than the first message
		require.NoError(t, err)
		require.Equal(t, positions(a[14:20]), got)
	})

	t.Run("recreated stream", func(t *testing.T) {
		old := s.Cursor()
		require.NoError(t, s.js.DeleteStream(t.Context(), "CDC"))
		require.NoError(t, s.Connect(t.Context()))
		require.NoError(t, s.Write(t.Context(), a[20:22]))
		got, err := s.Delivered(t.Context(), producer, old) // beyond the last sequence
		require.NoError(t, err)
		require.Equal(t, positions(a[20:22]), got)
		require.Equal(t, "2", s.Cursor(), "a fresh ack below the cursor resets it")
	})
}

func purge(t testing.TB, s *Sink, stream string) {
	t.Helper()
	st, err := s.js.Stream(t.Context(), stream)
	require.NoError(t, err)
	require.NoError(t, st.Purge(t.Context()))
}

// checkOutcome asserts that exactly the changes Write did not report failed
// are in the stream, in order.
func checkOutcome(t *testing.T, url string, batch []cdc.Change, err error) *sinks.BatchError {
	t.Helper()
	var berr *sinks.BatchError
	require.ErrorAs(t, err, &berr)
	var want []string
	for i := range batch {
		if _, failed := berr.Failed[i]; !failed {
			want = append(want, batch[i].ID())
		}
	}
	require.Equal(t, want, storedIDs(t, url, "CDC"), "stored ⇔ not reported failed")
	return berr
}

func TestOversizedIsPermanent(t *testing.T) {
	t.Run("server max_payload", func(t *testing.T) {
		srv := natsembed.StartT(t, natsembed.Options{MaxPayload: 4096})
		s := connected(t, srv, map[string]any{"atomic_transactions": false})
		batch := txs(producer, 0x1000, 1, 6)
		batch[2].Payload = make([]byte, 8000)
		berr := checkOutcome(t, srv.URL(), batch, s.Write(t.Context(), batch))
		require.True(t, sinks.IsPermanent(berr.Failed[2]), "%v", berr.Failed[2])
		require.ErrorContains(t, berr.Failed[2], "max_payload of 4096")
		require.NotContains(t, berr.Failed, 0)
		require.NotContains(t, berr.Failed, 1)
		for i := 3; i < 6; i++ {
			require.ErrorIs(t, berr.Failed[i], errSkipped)
			require.False(t, sinks.IsPermanent(berr.Failed[i]))
		}
		require.True(t, sinks.IsPermanent(berr))
		require.Equal(t, strconv.FormatUint(stored(t, srv.URL(), "CDC")[1].Sequence, 10), s.Cursor())
	})

	t.Run("stream max_msg_size, acks behind the failure", func(t *testing.T) {
		srv := natsembed.StartT(t, natsembed.Options{})
		createStream(t, srv.URL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdc.>"}, MaxMsgSize: 2048})
		s := connected(t, srv, map[string]any{"create_stream": false})
		batch := txs(producer, 0x1000, 1, 200)
		batch[50].Payload = make([]byte, 4096)
		berr := checkOutcome(t, srv.URL(), batch, s.Write(t.Context(), batch))
		require.True(t, sinks.IsPermanent(berr.Failed[50]), "%v", berr.Failed[50])
		require.ErrorContains(t, berr.Failed[50], "max_msg_size")
		for i, err := range berr.Failed {
			if i != 50 {
				require.False(t, sinks.IsPermanent(err), "#%d: %v", i, err)
			}
		}
		// Whatever was stored behind the gap stays findable from the cursor.
		got, err := s.Delivered(t.Context(), producer, s.Cursor())
		require.NoError(t, err)
		want := map[cdc.Pos]struct{}{}
		for i := 51; i < len(batch); i++ {
			if _, failed := berr.Failed[i]; !failed {
				want[batch[i].Pos()] = struct{}{}
			}
		}
		require.Equal(t, want, got)
	})
}

func createStream(t testing.TB, url string, cfg jetstream.StreamConfig) {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(t.Context(), cfg)
	require.NoError(t, err)
}

func TestSubjects(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	createStream(t, srv.URL(), jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}})
	// Per-message outcomes; with atomic transactions the whole transaction
	// fails together (TestDeadLetter, TestAtomicTransactions).
	s := connected(t, srv, map[string]any{"atomic_transactions": false})

	for _, tc := range []struct{ name, subject, msg string }{
		{"not bound", "elsewhere.x", `not bound to stream "CDC"`},
		{"bound to another stream", "other.x", `not bound to stream "CDC"`},
		{"wildcard", "cdc.*", "invalid subject"},
		{"empty", "", "invalid subject"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			batch := txs(producer, 0x1000, 1, 3)
			batch[1].Subject = tc.subject
			err := s.Write(t.Context(), batch)
			var berr *sinks.BatchError
			require.ErrorAs(t, err, &berr)
			require.Equal(t, []int{1, 2}, berr.Indexes())
			require.True(t, sinks.IsPermanent(berr.Failed[1]))
			require.ErrorContains(t, berr.Failed[1], tc.msg)
		})
	}

	t.Run("subject added to the stream later", func(t *testing.T) {
		nc, err := nats.Connect(srv.URL())
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		st, err := js.Stream(t.Context(), "CDC")
		require.NoError(t, err)
		cfg := st.CachedInfo().Config
		cfg.Subjects = append(cfg.Subjects, "late.>")
		_, err = js.UpdateStream(t.Context(), cfg)
		require.NoError(t, err)

		batch := txs(producer, 0x2000, 1, 1)
		batch[0].Subject = "late.x"
		require.NoError(t, s.Write(t.Context(), batch))

		// Then moved to another stream behind the sink's back: its reply
		// names that stream, and the change is not reported delivered.
		cfg.Subjects = slices.DeleteFunc(cfg.Subjects, func(s string) bool { return s == "late.>" })
		_, err = js.UpdateStream(t.Context(), cfg)
		require.NoError(t, err)
		createStream(t, srv.URL(), jetstream.StreamConfig{Name: "MOVED", Subjects: []string{"late.>"}})
		batch = txs(producer, 0x3000, 1, 1)
		batch[0].Subject = "late.x"
		err = s.Write(t.Context(), batch)
		var berr *sinks.BatchError
		require.ErrorAs(t, err, &berr)
		require.ErrorContains(t, berr.Failed[0], `stream "MOVED", not "CDC"`) // refused by it: the fence expects CDC's sequence
		require.True(t, sinks.IsPermanent(berr.Failed[0]), "%v", berr.Failed[0])
	})
}

func TestStreamSetup(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})

	t.Run("missing without create_stream", func(t *testing.T) {
		s := newSink(t, srv.URL(), map[string]any{"create_stream": false})
		err := s.Connect(t.Context())
		require.ErrorContains(t, err, `stream "CDC"`)
		require.ErrorContains(t, err, "create_stream: true")
	})

	t.Run("created", func(t *testing.T) {
		s := newSink(t, srv.URL(), map[string]any{"duplicate_window": "30s", "subjects": []any{"cdc.>", "x.*"}})
		require.NoError(t, s.Connect(t.Context()))
		info, err := s.js.Stream(t.Context(), "CDC")
		require.NoError(t, err)
		cfg := info.CachedInfo().Config
		require.Equal(t, jetstream.FileStorage, cfg.Storage)
		require.Equal(t, 30*time.Second, cfg.Duplicates)
		require.Equal(t, []string{"cdc.>", "x.*"}, cfg.Subjects)
	})

	t.Run("updated", func(t *testing.T) {
		s := newSink(t, srv.URL(), map[string]any{"duplicate_window": "1m", "subjects": []any{"y.>"}})
		require.NoError(t, s.Connect(t.Context()))
		info, err := s.js.Stream(t.Context(), "CDC")
		require.NoError(t, err)
		cfg := info.CachedInfo().Config
		require.Equal(t, time.Minute, cfg.Duplicates)
		require.Equal(t, []string{"cdc.>", "x.*", "y.>"}, cfg.Subjects, "subjects are added, never removed")
	})

	t.Run("existing without create_stream", func(t *testing.T) {
		s := newSink(t, srv.URL(), map[string]any{"create_stream": false})
		require.NoError(t, s.Connect(t.Context()))
	})

	t.Run("no server", func(t *testing.T) {
		s := newSink(t, "nats://127.0.0.1:1", nil)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		require.Error(t, s.Connect(ctx))
	})

	t.Run("secrets not echoed", func(t *testing.T) {
		s := newSink(t, "nats://bob:hunter2@127.0.0.1:1", nil)
		err := s.Connect(t.Context())
		require.Error(t, err)
		require.NotContains(t, err.Error(), "hunter2")
	})
}

func TestNotConnected(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := newSink(t, srv.URL(), nil)
	batch := txs(producer, 0x1000, 4, 5)

	err := s.Write(t.Context(), batch[:5])
	require.ErrorIs(t, err, sinks.ErrNotConnected, "Write before Connect")

	require.NoError(t, s.Connect(t.Context()))
	require.NoError(t, s.Write(t.Context(), batch[:5]))

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))

	ctx, cancel = context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.Write(ctx, batch[5:10])
	require.ErrorIs(t, err, sinks.ErrNotConnected)
	require.Less(t, time.Since(start), time.Second)

	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, s.Connect(ctx), sinks.ErrNotConnected, "Connect waits for the server within ctx")

	natsembed.StartT(t, srv.Options()) // same port, same store
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Connect(ctx))
	require.NoError(t, s.Write(ctx, batch[5:]))
	require.Equal(t, ids(batch), storedIDs(t, srv.URL(), "CDC"))
}

// TestDisconnectMidWrite cuts the connection while acks are outstanding:
// the Write fails with ErrNotConnected at once, nothing is resent behind
// its back, and a retry after Connect stores everything exactly once.
func TestDisconnectMidWrite(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	p := newProxy(t, srv.NATS().Addr().String())
	// Asynchronous publishes: an atomic batch cut mid-way waits for its
	// commit's ack_timeout instead (TestAtomicTransactions).
	s := connected(t, srv, map[string]any{"url": p.URL(), "atomic_transactions": false})

	batch := txs(producer, 0x1000, 10, 10)
	require.NoError(t, s.Write(t.Context(), batch[:20]))

	p.freeze()
	errc := make(chan error, 1)
	go func() { errc <- s.Write(t.Context(), batch[20:]) }()
	time.Sleep(100 * time.Millisecond) // let the publishes reach the frozen proxy
	p.cut()
	p.thaw()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, sinks.ErrNotConnected)
		var berr *sinks.BatchError
		require.ErrorAs(t, err, &berr)
		require.Len(t, berr.Failed, 80)
	case <-time.After(5 * time.Second):
		t.Fatal("Write did not return after the connection was cut")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, s.Connect(ctx))
	require.Equal(t, ids(batch[:20]), storedIDs(t, srv.URL(), "CDC"), "nothing resent after the reconnect")
	require.NoError(t, s.Write(ctx, batch[20:]))
	require.Equal(t, ids(batch), storedIDs(t, srv.URL(), "CDC"))
}

func TestWriteCtx(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	p := newProxy(t, srv.NATS().Addr().String())
	s := connected(t, srv, map[string]any{"url": p.URL()})
	batch := txs(producer, 0x1000, 1, 10)

	p.freeze()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Write(ctx, batch)
	require.Less(t, time.Since(start), 500*time.Millisecond)
	var berr *sinks.BatchError
	require.ErrorAs(t, err, &berr)
	require.Len(t, berr.Failed, len(batch), "no ack, no success")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Empty(t, s.Cursor())
	p.thaw()
}

func TestClose(t *testing.T) {
	t.Run("idempotent, then refuses", func(t *testing.T) {
		srv := natsembed.StartT(t, natsembed.Options{})
		s := connected(t, srv, nil)
		require.NoError(t, s.Write(t.Context(), txs(producer, 0x1000, 1, 3)))
		require.NoError(t, s.Close(t.Context()))
		require.NoError(t, s.Close(t.Context()))
		err := s.Write(t.Context(), txs(producer, 0x2000, 1, 3))
		require.True(t, sinks.IsPermanent(err), "%v", err)
		require.True(t, sinks.IsPermanent(s.Connect(t.Context())))
	})

	t.Run("never connected", func(t *testing.T) {
		s := newSink(t, "nats://127.0.0.1:1", nil)
		require.NoError(t, s.Close(t.Context()))
	})

	t.Run("server shut down", func(t *testing.T) {
		srv := natsembed.StartT(t, natsembed.Options{})
		s := connected(t, srv, nil)
		require.NoError(t, s.Write(t.Context(), txs(producer, 0x1000, 1, 3)))
		require.NoError(t, srv.Shutdown(t.Context()))
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_ = s.Close(ctx)
		require.Less(t, time.Since(start), 300*time.Millisecond, "Close took longer than its 100ms deadline")
	})

	t.Run("server frozen with acks in flight", func(t *testing.T) {
		srv := natsembed.StartT(t, natsembed.Options{})
		p := newProxy(t, srv.NATS().Addr().String())
		// Asynchronous publishes (atomic batches wait for their commit instead).
		s := connected(t, srv, map[string]any{"url": p.URL(), "atomic_transactions": false})
		p.freeze()
		wctx, wcancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer wcancel()
		require.Error(t, s.Write(wctx, txs(producer, 0x1000, 5, 100)))
		require.Positive(t, s.acks.pending())

		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := s.Close(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, time.Since(start), 300*time.Millisecond, "Close took longer than its 100ms deadline")
		p.thaw()
	})
}

func TestCursorNeverPassesAGap(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, nil)
	batch := txs(producer, 0x1000, 1, 4)
	require.NoError(t, s.Write(t.Context(), batch[:2]))
	require.Equal(t, "2", s.Cursor())

	// Fake the outcome of a Write whose #1 failed while #2 and #3 were stored.
	w := &write{batch: batch[:4], seqs: []uint64{3, 0, 5, 6}}
	w.err.Fail(1, errors.New("ack timeout"))
	s.advanceCursor(w)
	require.Equal(t, "3", s.Cursor())
}

// TestStreamDeleted: publishes to a stream that vanished meet "no
// responders"; they fail with ErrNotConnected (never resent by the client
// behind later ones), and Connect recreates the stream.
func TestStreamDeleted(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, nil)
	batch := txs(producer, 0x1000, 2, 5)
	require.NoError(t, s.Write(t.Context(), batch[:5]))
	require.NoError(t, s.js.DeleteStream(t.Context(), "CDC"))

	err := s.Write(t.Context(), batch[5:])
	require.ErrorIs(t, err, sinks.ErrNotConnected)
	var berr *sinks.BatchError
	require.ErrorAs(t, err, &berr)
	require.Len(t, berr.Failed, 5)

	require.NoError(t, s.Connect(t.Context()))
	require.NoError(t, s.Write(t.Context(), batch[5:]))
	require.Equal(t, ids(batch[5:]), storedIDs(t, srv.URL(), "CDC"))
}

func TestDeadLetter(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{MaxPayload: 4096})
	s := connected(t, srv, map[string]any{"dead_letter_subject": "cdc.dead"})
	batch := txs(producer, 0x1000, 1, 5)
	batch[1].Payload = make([]byte, 8000) // over max_payload
	batch[3].Subject = "other.subject"    // not bound to the stream
	require.NoError(t, s.Write(t.Context(), batch))
	msgs := stored(t, srv.URL(), "CDC")
	require.Len(t, msgs, 5)
	for i, m := range msgs {
		require.Equal(t, batch[i].ID(), m.Header.Get(jetstream.MsgIDHeader), "order and ids kept")
	}
	require.Equal(t, "cdc.dead", msgs[1].Subject)
	require.Contains(t, msgs[1].Header.Get(HeaderDeadLetterReason), "max_payload of 4096")
	require.Equal(t, "8000", msgs[1].Header.Get(HeaderPayloadBytes))
	require.Empty(t, msgs[1].Data)
	require.Equal(t, "cdc.dead", msgs[3].Subject)
	require.Equal(t, "other.subject", msgs[3].Header.Get(HeaderOriginalSubject))
	require.Contains(t, msgs[3].Header.Get(HeaderDeadLetterReason), "not bound to stream")
	require.Equal(t, batch[3].Payload, msgs[3].Data)
	require.Equal(t, uint64(2), s.DeadLetters(), "the two diverted changes are counted")
	// Dead letters count as delivered on a replay: same ids.
	got, err := s.Delivered(t.Context(), producer, "")
	require.NoError(t, err)
	require.Equal(t, positions(batch), got)

	// Without a dead-letter subject the refusal stops the batch, permanently.
	s2 := connected(t, srv, map[string]any{"atomic_transactions": true})
	b2 := txs(producer, 0x2000, 1, 3)
	b2[1].Payload = make([]byte, 8000)
	err = s2.Write(t.Context(), b2)
	require.True(t, sinks.IsPermanent(err))
	var berr *sinks.BatchError
	require.ErrorAs(t, err, &berr)
	require.ErrorContains(t, berr.Failed[1], "dead_letter_subject")
	require.Contains(t, berr.Failed, 0, "its transaction goes all or nothing")
	require.Len(t, storedIDs(t, srv.URL(), "CDC"), 5, "nothing of the refused transaction is stored")
	require.Zero(t, s2.DeadLetters(), "no dead letter without a dead-letter subject")
	var _ sinks.DeadLetterCounter = s
}

// TestAtomicTransactions: whole transactions go as atomic batches; one
// that cannot be stored leaves nothing of itself in the stream, and a
// transaction already partly stored is completed message by message.
func TestAtomicTransactions(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{})
	s := connected(t, srv, map[string]any{"atomic_transactions": true})
	require.True(t, s.atomicOK(), "the created stream allows atomic publishing")
	batch := txs(producer, 0x1000, 4, 5)
	require.NoError(t, s.Write(t.Context(), batch))
	msgs := stored(t, srv.URL(), "CDC")
	require.Len(t, msgs, 20)
	for i, m := range msgs {
		require.Equal(t, batch[i].ID(), m.Header.Get(jetstream.MsgIDHeader))
		require.NotEmpty(t, m.Header.Get("Nats-Batch-Id"), "stored through an atomic batch")
	}
	require.Equal(t, strconv.FormatUint(msgs[19].Sequence, 10), s.Cursor())

	// A replay: stored once.
	require.NoError(t, s.Write(t.Context(), batch))
	require.Len(t, storedIDs(t, srv.URL(), "CDC"), 20)

	// A replay of a transaction of which one message is stored already.
	more := txs(producer, 0x9000, 1, 4)
	require.NoError(t, s.Write(t.Context(), more[1:2]))
	require.NoError(t, s.Write(t.Context(), more))
	got := storedIDs(t, srv.URL(), "CDC")
	require.Len(t, got, 24, "each change once")
	require.ElementsMatch(t, ids(more), got[20:])
}

func TestLargePayloadGoesThroughObjectStore(t *testing.T) {
	srv := natsembed.StartT(t, natsembed.Options{MaxPayload: 4096})
	s := connected(t, srv, map[string]any{"large_payload_bucket": "big"})
	batch := txs(producer, 0x1000, 1, 3)
	big := make([]byte, 300000)
	for i := range big {
		big[i] = byte('a' + i%26)
	}
	batch[1].Payload = big
	require.NoError(t, s.Write(t.Context(), batch))
	require.NoError(t, s.Write(t.Context(), batch), "a replay stores nothing twice")
	msgs := stored(t, srv.URL(), "CDC")
	require.Len(t, msgs, 3)
	require.Equal(t, batch[1].Subject, msgs[1].Subject)
	require.Empty(t, msgs[1].Data)
	require.Equal(t, "big/"+batch[1].ID(), msgs[1].Header.Get(HeaderPayloadObject))
	require.Equal(t, "300000", msgs[1].Header.Get(HeaderPayloadBytes))
	nc, err := nats.Connect(srv.URL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	obs, err := js.ObjectStore(t.Context(), "big")
	require.NoError(t, err)
	got, err := obs.GetBytes(t.Context(), batch[1].ID())
	require.NoError(t, err)
	require.Equal(t, big, got)
}
