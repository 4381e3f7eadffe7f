package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/config"
)

// TestSplitServeProblems: problems in the sections `bridge serve` reads
// stop it, the others are listed as ignored, and an error that is not a
// list of configuration problems is kept whole.
func TestSplitServeProblems(t *testing.T) {
	fe := func(path string) *config.FieldError { return &config.FieldError{Path: path, Msg: "bad"} }
	kept, ignored := splitServeProblems(config.Errors{
		fe("sources.shop.config.dsn"), fe("serve.hold"), fe("routes[0].sinks"), fe("nats.url"),
		fe("sinks.main.config.stream"), fe("data_dir"), fe("serveless"), fe("log.level"),
	})
	var ferrs config.Errors
	require.True(t, errors.As(kept, &ferrs))
	var paths []string
	for _, e := range ferrs {
		paths = append(paths, e.Path)
	}
	assert.Equal(t, []string{"serve.hold", "nats.url", "data_dir", "log.level"}, paths)
	assert.Equal(t, []string{"sources.shop.config.dsn", "routes[0].sinks", "sinks.main.config.stream", "serveless"}, ignored)

	kept, ignored = splitServeProblems(config.Errors{fe("sources.shop.config.dsn")})
	require.NoError(t, kept, "nothing serve reads is wrong")
	assert.Equal(t, []string{"sources.shop.config.dsn"}, ignored)

	other := fmt.Errorf("line 3: mapping values are not allowed here")
	kept, ignored = splitServeProblems(other)
	assert.Equal(t, other, kept)
	assert.Empty(t, ignored)
	kept, ignored = splitServeProblems(nil)
	assert.NoError(t, kept)
	assert.Empty(t, ignored)
}

// TestServeWarnings: a listener other machines reach gets a warning for
// serving without authentication and one for unsigned resume tokens; a
// loopback one gets none.
func TestServeWarnings(t *testing.T) {
	secret := strings.Repeat("s", 32)
	open := config.Serve{Auth: config.ServeAuth{Mode: config.AuthNone}}
	assert.Empty(t, serveWarnings(open, "127.0.0.1:8090"))
	assert.Empty(t, serveWarnings(open, "localhost:8090"))
	assert.Empty(t, serveWarnings(open, "[::1]:8090"))

	ws := serveWarnings(open, "0.0.0.0:8090")
	require.Len(t, ws, 2)
	assert.Contains(t, ws[0], "without authentication")
	assert.Contains(t, ws[1], "resume tokens are unsigned (serve.token_secret is not set)")

	signed := open
	signed.TokenSecret = secret
	ws = serveWarnings(signed, "10.0.0.5:8090")
	require.Len(t, ws, 1)
	assert.Contains(t, ws[0], "without authentication")

	proxied := config.Serve{ClientHeader: "X-Client", TokenSecret: secret}
	assert.Empty(t, serveWarnings(proxied, ":8090"), "authenticated, signed tokens")
	proxied.TokenSecret = ""
	ws = serveWarnings(proxied, ":8090")
	require.Len(t, ws, 1)
	assert.Contains(t, ws[0], "set serve.token_secret")
}
