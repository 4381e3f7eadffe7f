package filesink_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/sinks/sinktest"

	"example.com/acme-bridge/filesink"
)

// TestConformance runs the bridge's conformance suite against the sink,
// as every sink should.
func TestConformance(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	sinktest.Run(t, sinktest.Harness{
		Type: "acme_file",
		YAML: "path: " + path + "\nsync: false\n",
		Read: func(t *testing.T) []sinktest.Received { return readLines(t, path) },
	})
}

func readLines(t *testing.T, path string) []sinktest.Received {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	defer f.Close()
	var out []sinktest.Received
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var l filesink.Line
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
		p := []byte(l.Payload)
		if l.PayloadBase64 != nil {
			p = l.PayloadBase64
		}
		out = append(out, sinktest.Received{ID: l.ID, Subject: l.Subject, Payload: p, Headers: l.Headers})
	}
	require.NoError(t, sc.Err())
	return out
}
