package serve

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/bridgecdc/bridge/bridge/feeds"
	"github.com/bridgecdc/bridge/bridge/serve/ssetest"
)

// FuzzSSEEvent writes a changes event whose change holds arbitrary bytes
// (a json column keeps its text as written: raw line breaks, "\r", any
// byte), then an up-to-date event, reads the stream back with an event
// stream parser that follows the HTML standard (ssetest.Parser, the way
// EventSource reads it), and checks that both events arrive whole: the
// changes event once, with its id, and its data the batch as written but
// for line breaks, which every reader gets as "\n". Its seeds run in
// every go test; go test -fuzz FuzzSSEEvent ./bridge/serve searches on.
func FuzzSSEEvent(f *testing.F) {
	for _, seed := range []string{
		`{"seq":1,"after":{"id":1,"doc":{"a":1}}}`,
		"{\"seq\":2,\"after\":{\"doc\":{\"a\":\n\n1}}}",
		"{\"seq\":3,\"after\":{\"doc\":{\"a\":\r1}}}",
		"{\"seq\":4,\"after\":{\"doc\":{\"a\":\r\n\r\n1,\n\"b\":\r\r2}}}",
		"\n",
		"\r",
		"\r\n\n\r",
		"data: forged\n\nid: 1.999\nevent: changes\ndata: {}\n\n",
		": comment\r\nevent: must-refetch",
		"\x00\x01\x7f\xff",
	} {
		f.Add([]byte(seed))
	}
	s := New(nil, Config{}, nil)
	f.Fuzz(func(t *testing.T, change []byte) {
		b := feeds.Batch{Token: feeds.Token{Stream: "lx1y2z", Seq: 42}, UpToDate: true,
			Changes: []feeds.Change{{Seq: 41, JSON: change}, {Seq: 42, JSON: []byte(`{"seq":42}`)}}}
		body := s.appendBatch(nil, b)
		stream := appendEvent(nil, s.tokenText(b.Token), "changes", body)
		stream = appendEvent(stream, s.tokenText(b.Token), "up-to-date", []byte(`{"token":"lx1y2z.42"}`))

		var p ssetest.Parser
		// In two pieces, as a network may deliver it: the parser must not
		// care where the cut falls.
		half := len(stream) / 2
		p.Write(stream[:half])
		p.Write(stream[half:])
		var got []ssetest.Block
		for {
			blk, ok := p.Next()
			if !ok {
				break
			}
			got = append(got, blk)
		}
		if len(got) != 2 {
			t.Fatalf("want 2 events, got %d blocks %+v from stream %q", len(got), got, stream)
		}
		want := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(string(body))
		for i, typ := range []string{"changes", "up-to-date"} {
			if !got[i].Dispatched || got[i].Type != typ || got[i].LastEventID != "lx1y2z.42" {
				t.Fatalf("event %d: want a dispatched %q with id lx1y2z.42, got %+v from stream %q", i, typ, got[i], stream)
			}
		}
		if got[0].Data != want {
			t.Fatalf("changes event cut or altered:\n got %q\nwant %q\nstream %q", got[0].Data, want, stream)
		}
		if json.Valid(body) != json.Valid([]byte(got[0].Data)) {
			t.Fatalf("json.Valid differs: written %q, read %q", body, got[0].Data)
		}
		if !bytes.Contains(stream, []byte("\ndata: {\"token\":\"lx1y2z.42\"}\n\n")) {
			t.Fatalf("the up-to-date event is not written whole after the changes: %q", stream)
		}
	})
}
