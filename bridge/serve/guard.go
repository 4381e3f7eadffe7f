package serve

import (
	"net/http"

	"github.com/bridgecdc/bridge/internal/httpguard"
)

// guard returns h behind the listener's Host and Origin checks
// (internal/httpguard): on a loopback Listen a request naming another
// host than localhost, a loopback address or one of AllowedHosts gets 403
// with the reason, so that a page whose name is re-pointed at 127.0.0.1
// (DNS rebinding) reads no feed, with or without serve.auth.
func (s *Server) guard(h http.Handler) http.Handler {
	return httpguard.New(httpguard.Options{Listen: s.cfg.Listen, Hosts: s.cfg.AllowedHosts, Key: "serve.allowed_hosts", Log: s.log}).Handler(h)
}
