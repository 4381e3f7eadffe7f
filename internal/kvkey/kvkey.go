// Package kvkey escapes text into one token of a JetStream KV key, and
// back. A key is tokens joined by '.'; NATS allows only [-/_=.A-Za-z0-9] in
// one. Bytes outside [A-Za-z0-9_-] (including '.', '/' and '=' itself) are
// written as "=XX", upper-case hex, and the empty string as a lone "=",
// which no escape produces: every string has one token, distinct strings
// distinct tokens, and Unescape undoes Escape.
package kvkey

import (
	"fmt"
	"strings"
)

const hexDigits = "0123456789ABCDEF"

// plain reports whether byte c stands for itself in a token.
func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// Escape returns s as one key token.
func Escape(s string) string {
	for i := 0; i < len(s); i++ {
		if !plain(s[i]) {
			return string(Append(make([]byte, 0, len(s)+8), s))
		}
	}
	if s == "" {
		return "="
	}
	return s
}

// Append appends s as one key token to dst.
func Append(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, '=')
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '=', hexDigits[c>>4], hexDigits[c&0xF])
	}
	return dst
}

// Unescape returns the string tok stands for. It refuses what Escape never
// returns: an empty token, a '.' or a byte outside the key alphabet, a '='
// not followed by two upper-case hex digits (a lone "=" is the empty
// string), and an escape of a byte that stands for itself.
func Unescape(tok string) (string, error) {
	if tok == "=" {
		return "", nil
	}
	if tok == "" {
		return "", fmt.Errorf("an empty key token")
	}
	if strings.IndexByte(tok, '=') < 0 {
		for i := 0; i < len(tok); i++ {
			if !plain(tok[i]) {
				return "", fmt.Errorf("key token %q: byte %q at %d is not escaped", tok, tok[i], i)
			}
		}
		return tok, nil
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case plain(c):
			out = append(out, c)
		case c == '=':
			if i+2 >= len(tok) {
				return "", fmt.Errorf("key token %q: '=' at %d is not followed by two hex digits", tok, i)
			}
			hi, lo := unhex(tok[i+1]), unhex(tok[i+2])
			if hi < 0 || lo < 0 {
				return "", fmt.Errorf("key token %q: '=' at %d is not followed by two upper-case hex digits", tok, i)
			}
			b := byte(hi<<4 | lo)
			if plain(b) {
				return "", fmt.Errorf("key token %q: %q at %d escapes %q, which is never escaped", tok, tok[i:i+3], i, b)
			}
			out = append(out, b)
			i += 2
		default:
			return "", fmt.Errorf("key token %q: byte %q at %d is not escaped", tok, c, i)
		}
	}
	return string(out), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
