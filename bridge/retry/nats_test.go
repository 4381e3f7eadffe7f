package retry

import (
	"crypto/x509"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"

	"github.com/bridgecdc/bridge/internal/natsconn"
)

// TestPermanentNATS: a NATS TLS, credentials or permission problem stops
// the bridge (its *natsconn.Error carries the fix), as does a certificate
// that does not verify on another path; a timeout is retried.
func TestPermanentNATS(t *testing.T) {
	explained := fmt.Errorf("connecting to nats://h:4222: %w", &natsconn.Error{What: "nats.tls.ca_file /ca.crt does not sign the NATS server's certificate", Fix: "set nats.tls.ca_file"})
	fix, ok := Permanent(explained)
	assert.True(t, ok)
	assert.Empty(t, fix, "the error says its fix")
	assert.Equal(t, explained.Error(), Explain(explained).Error())

	fix, ok = Permanent(fmt.Errorf("dialing: %w", x509.UnknownAuthorityError{}))
	assert.True(t, ok)
	assert.Contains(t, fix, "nats.tls.ca_file")
	fix, ok = Permanent(fmt.Errorf("dialing: %w", x509.HostnameError{Host: "h"}))
	assert.True(t, ok)
	assert.Contains(t, fix, "server_name")

	_, ok = Permanent(fmt.Errorf("saving: %w", nats.ErrTimeout))
	assert.False(t, ok)
}
