package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServeSignedTokens runs `bridge serve` (the binary) with
// serve.token_secret: every token it hands out is signed and resumes; a
// token it did not hand out (a forged one at sequence 0, one with its
// signature stripped, one whose sequence was changed) is refused with 400
// and the reason, on long-poll and SSE alike; and `bridge validate`
// refuses a secret shorter than 32 bytes.
func TestServeSignedTokens(t *testing.T) {
	defer parallel(t)()
	natsURL, _ := cdcStream(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	const secret = "resume-token-secret-0123456789abcdef"
	cfg := serveYAML(t, natsURL, fmt.Sprintf("  listen: %q\n  token_secret: %q\n", addr, secret))
	b := startBinary(t, nil, "serve", "-c", cfg)
	base := "http://" + addr
	waitHTTP(t, b, base, "/readyz")

	code, body := call(t, t.Context(), "GET", base+"/v1/position", "", nil, "")
	require.Equal(t, http.StatusOK, code, body)
	var pos struct{ Token string }
	require.NoError(t, json.Unmarshal([]byte(body), &pos))
	parts := strings.Split(pos.Token, ".")
	require.Len(t, parts, 3, "<stream id>.<sequence>.<signature>: %s", pos.Token)

	code, body = call(t, t.Context(), "GET", base+"/v1/feed?timeout=1ms&token="+pos.Token, "", nil, "")
	require.Equal(t, http.StatusOK, code, "a token the server handed out resumes: %s", body)
	var poll struct{ Token string }
	require.NoError(t, json.Unmarshal([]byte(body), &poll))
	require.Len(t, strings.Split(poll.Token, "."), 3, "the answer's token is signed: %s", poll.Token)

	const unsigned = "token: not issued by this server: it carries no signature, and serve.token_secret requires one (resume from a token a response returned, or from token=now)"
	const forged = "token: not issued by this server: its signature does not match serve.token_secret (resume from a token a response returned, or from token=now)"
	for _, tc := range []struct{ name, token, want string }{
		{"forged at sequence 0", parts[0] + ".0", unsigned},
		{"signature stripped", parts[0] + "." + parts[1], unsigned},
		{"sequence changed", parts[0] + ".999." + parts[2], forged},
		{"signature made up", parts[0] + ".0.AAAAAAAAAAAAAAAAAAAAAA", forged},
	} {
		code, body := call(t, t.Context(), "GET", base+"/v1/feed?timeout=1ms&token="+tc.token, "", nil, "")
		require.Equal(t, http.StatusBadRequest, code, "%s: %s", tc.name, body)
		require.Equal(t, tc.want, detail(t, body), tc.name)
		code, body = call(t, t.Context(), "GET", base+"/v1/feed?sse=1", "", map[string]string{"Last-Event-ID": tc.token}, "")
		require.Equal(t, http.StatusBadRequest, code, "%s over SSE: %s", tc.name, body)
		require.Equal(t, tc.want, detail(t, body), tc.name)
	}

	require.NotContains(t, b.out.String(), secret, "the secret is never logged")

	short := serveYAML(t, natsURL, "  token_secret: too-short\n")
	raw, err := exec.Command(bridgeBinary(t), "validate", "-c", short).CombinedOutput()
	out := string(raw)
	require.Error(t, err, "%s", out)
	require.Contains(t, out, "serve.token_secret: must be at least 32 bytes (256 bits), got 9")
	require.NotContains(t, out, "too-short", "the secret is never printed")
}
