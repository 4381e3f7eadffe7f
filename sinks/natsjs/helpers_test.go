package natsjs

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/natsembed"
	"github.com/bridgecdc/bridge/sinks"
)

// TestMain checks for leaked goroutines. nats-server 2.15 leaves the file
// store loops of atomic-batch staging running after Shutdown for a while;
// they are the in-process server's, not the sink's.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"))
}

// decoderFor is a strict Decoder over raw, like the runtime's: koanf tags,
// unknown keys are errors, durations from strings, then Validate.
func decoderFor(raw map[string]any) config.Decoder {
	return func(into any) error {
		d, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
			TagName:     "koanf",
			ErrorUnused: true,
			Result:      into,
			DecodeHook: mapstructure.ComposeDecodeHookFunc(
				mapstructure.StringToTimeDurationHookFunc(),
				mapstructure.TextUnmarshallerHookFunc()),
		})
		if err != nil {
			return err
		}
		if err := d.Decode(raw); err != nil {
			return err
		}
		if v, ok := into.(interface{ Validate() error }); ok {
			return v.Validate()
		}
		return nil
	}
}

// newSink builds a sink on url with stream "CDC" plus extra config.
func newSink(t testing.TB, url string, extra map[string]any) *Sink {
	t.Helper()
	raw := map[string]any{"url": url, "stream": "CDC", "ack_timeout": "5s"}
	for k, v := range extra {
		raw[k] = v
	}
	sk, err := New(decoderFor(raw), sinks.Env{Name: "main"})
	require.NoError(t, err)
	s := sk.(*Sink)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// connected returns a sink connected to srv.
func connected(t testing.TB, srv *natsembed.Server, extra map[string]any) *Sink {
	t.Helper()
	s := newSink(t, srv.URL(), extra)
	require.NoError(t, s.Connect(t.Context()))
	return s
}

// txs returns ntx transactions of perTx changes each by producer, commit
// LSNs from base upwards.
func txs(producer string, base cdc.LSN, ntx, perTx int) []cdc.Change {
	var out []cdc.Change
	for tx := range ntx {
		for j := range perTx {
			c := cdc.Change{
				Producer:  producer,
				Source:    "main",
				CommitLSN: base + cdc.LSN(tx)*0x100,
				Seq:       uint32(j),
				TxSize:    uint32(perTx),
				Xid:       uint32(1000 + tx),
				Schema:    "public",
				Table:     "orders",
				Op:        cdc.OpInsert,
				Subject:   "cdc.main.public.orders",
				Headers:   map[string]string{"traceparent": fmt.Sprintf("00-%032x-%016x-01", tx+1, j+1)},
			}
			c.Payload = fmt.Appendf(nil, `{"id":%q}`, c.ID())
			out = append(out, c)
		}
	}
	return out
}

// stored returns the stream's messages in order.
func stored(t testing.TB, url, stream string) []*jetstream.RawStreamMsg {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	st, err := js.Stream(t.Context(), stream)
	require.NoError(t, err)
	state := st.CachedInfo().State
	var out []*jetstream.RawStreamMsg
	if state.Msgs == 0 {
		return nil
	}
	for seq := state.FirstSeq; seq <= state.LastSeq; seq++ {
		m, err := st.GetMsg(t.Context(), seq)
		if err != nil {
			continue // deleted
		}
		out = append(out, m)
	}
	return out
}

// storedIDs returns the Nats-Msg-Ids in the stream, in order.
func storedIDs(t testing.TB, url, stream string) []string {
	t.Helper()
	var ids []string
	for _, m := range stored(t, url, stream) {
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ids
}

func ids(batch []cdc.Change) []string {
	out := make([]string, len(batch))
	for i := range batch {
		out[i] = batch[i].ID()
	}
	return out
}

func positions(batch []cdc.Change) map[cdc.Pos]struct{} {
	out := map[cdc.Pos]struct{}{}
	for i := range batch {
		out[batch[i].Pos()] = struct{}{}
	}
	return out
}

// proxy forwards TCP to a server and can freeze (stop forwarding in both
// directions, like a hung server) or cut every connection.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen chan struct{} // non-nil while frozen; closed on thaw
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(u, c)
		go p.pipe(c, u)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			f := p.frozen
			p.mu.Unlock()
			if f != nil {
				<-f
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF or a cut
			return
		}
	}
}

func (p *proxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

func (p *proxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

// cut closes every proxied connection, dropping what is in flight.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) close() {
	p.ln.Close()
	p.cut()
	p.thaw()
	p.wg.Wait()
}

// writeRest resumes after a failed Write, as the pipeline does: Connect,
// then Delivered, then a Write of the changes of cs the stream does not
// hold yet.
func writeRest(t *testing.T, s *Sink, cs []cdc.Change) {
	t.Helper()
	require.NoError(t, s.Connect(t.Context()))
	held, err := s.Delivered(t.Context(), producer, "")
	require.NoError(t, err)
	var rest []cdc.Change
	for _, c := range cs {
		if _, ok := held[c.Pos()]; !ok {
			rest = append(rest, c)
		}
	}
	require.NoError(t, s.Write(t.Context(), rest))
}
