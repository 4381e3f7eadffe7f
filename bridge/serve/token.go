// Resume tokens on the wire: a feeds.Token's text, signed with
// Config.TokenSecret when it is set, so that a client can only resume from
// a position this server (or another with the same secret) handed out.

package serve

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"

	"github.com/bridgecdc/bridge/bridge/feeds"
)

// tokenTagLen is the length of a token's signature: 16 bytes of
// HMAC-SHA256, base64url without padding.
const tokenTagLen = 22

// tokenText is t as the server hands it out: "<stream id>.<sequence>",
// followed by ".<signature>" when TokenSecret is set; "" for the zero
// token.
func (s *Server) tokenText(t feeds.Token) string {
	txt := t.String()
	if txt == "" || len(s.cfg.TokenSecret) == 0 {
		return txt
	}
	return txt + "." + s.tokenTag(txt)
}

func (s *Server) tokenTag(txt string) string {
	m := hmac.New(sha256.New, s.cfg.TokenSecret)
	m.Write([]byte("bridge serve resume token\x00"))
	m.Write([]byte(txt))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
}

// errUnsigned and errForged refuse a token that this server did not hand
// out while TokenSecret is set.
var (
	errUnsigned = errors.New("not issued by this server: it carries no signature, and serve.token_secret requires one (resume from a token a response returned, or from token=now)")
	errForged   = errors.New("not issued by this server: its signature does not match serve.token_secret (resume from a token a response returned, or from token=now)")
)

// parseToken reads a token the client sent; "" is the zero token. With
// TokenSecret set it must carry the signature tokenText gives it.
func (s *Server) parseToken(v string) (feeds.Token, error) {
	if v == "" || len(s.cfg.TokenSecret) == 0 {
		return feeds.ParseToken(v)
	}
	i := strings.LastIndexByte(v, '.')
	if i < 0 || len(v)-i-1 != tokenTagLen || !strings.Contains(v[:i], ".") {
		if _, err := feeds.ParseToken(v); err != nil {
			return feeds.Token{}, err
		}
		return feeds.Token{}, errUnsigned
	}
	body, tag := v[:i], v[i+1:]
	if !hmac.Equal([]byte(tag), []byte(s.tokenTag(body))) {
		return feeds.Token{}, errForged
	}
	return feeds.ParseToken(body)
}
