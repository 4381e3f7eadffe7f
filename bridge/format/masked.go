package format

import "strings"

// HeaderMasked is the header a route sets on a change whose columns it
// masked: "<column>=<mask>" pairs joined by ",", in table column order,
// where mask is redact, hash or truncate, e.g. "email=hash,ssn=redact".
// In a column name, ',', '=', '%' and control characters are
// percent-encoded (%2C). Sinks publish it with the change's other
// headers; the formats carry it in the payload too (AppendNative's
// "masked", Debezium's source.masked, the CloudEvents extension pgmasked).
const HeaderMasked = "Bridge-Masked"

// AppendMasked appends the value of a HeaderMasked header as a JSON
// object from column name to mask: {"email":"hash","ssn":"redact"}.
func AppendMasked(dst []byte, h string) []byte {
	dst = append(dst, '{')
	for n := 0; h != ""; n++ {
		pair := h
		if i := strings.IndexByte(h, ','); i >= 0 {
			pair, h = h[:i], h[i+1:]
		} else {
			h = ""
		}
		name, mask := pair, ""
		if i := strings.IndexByte(pair, '='); i >= 0 {
			name, mask = pair[:i], pair[i+1:]
		}
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, unescapeHeader(name))
		dst = append(dst, ':')
		dst = appendString(dst, mask)
	}
	return append(dst, '}')
}

// unescapeHeader undoes the percent-encoding of a column name in
// HeaderMasked.
func unescapeHeader(s string) string {
	if strings.IndexByte(s, '%') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
