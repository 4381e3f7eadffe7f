package format

import (
	"strconv"
	"strings"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// CloudEventsContentType is the media type of AppendCloudEvent's output,
// the CloudEvents JSON event format, for the Content-Type header.
const CloudEventsContentType = "application/cloudevents+json"

// CloudEventTypePrefix starts every CloudEvent type; the op follows it.
const CloudEventTypePrefix = "io.bridgecdc."

// AppendCloudEvent appends c as a CloudEvents 1.0 event in structured mode
// (the JSON event format), with attributes in this order:
//
//	"specversion"      "1.0"
//	"id"               c.ID(), the Nats-Msg-Id: unique per source, and the
//	                   same when a replay sends the change again
//	"source"           "/bridge/<source>/<database>", a relative URI
//	                   reference; each segment is percent-encoded (RFC 3986
//	                   pchar) so any name yields a valid one
//	"type"             CloudEventTypePrefix + op: "io.bridgecdc.insert",
//	                   ".update", ".delete", ".truncate", ".message", ".read"
//	"subject"          "<schema>.<table>"; the prefix for a message; left out
//	                   when empty or blank
//	"time"             commit time, RFC 3339 in UTC with microseconds; left
//	                   out when unknown (non-transactional message)
//	"datacontenttype"  "application/json"
//	"pglsn"            extension: commit end LSN, Postgres form "0/16B37A0"
//	"pgseq"            extension: c.Seq, the position in the transaction, as
//	                   a decimal string (CloudEvents integers are 32-bit
//	                   signed, Seq is unsigned)
//	"pgxid"            extension: the transaction id as a decimal string
//	                   (xids above 2^31 are common); left out when 0
//	"pgmasked"         extension: the columns the route masked and how, as
//	                   in the Bridge-Masked header (HeaderMasked), when c.Headers
//	                   has it
//	"traceparent", "tracestate"  the distributed tracing extension, copied
//	                   from c.Headers when set there
//	"data"             the change in the native encoding (AppendNative)
func AppendCloudEvent(dst []byte, c *cdc.Change) []byte {
	dst = appendCloudEventAttrs(dst, c)
	dst = AppendNative(dst, c)
	return append(dst, '}')
}

// AppendCloudEventData appends c as AppendCloudEvent does, with data, the
// JSON a route's transform produced, as the event's data instead of the
// native encoding of the change.
func AppendCloudEventData(dst []byte, c *cdc.Change, data []byte) []byte {
	dst = appendCloudEventAttrs(dst, c)
	dst = append(dst, data...)
	return append(dst, '}')
}

// appendCloudEventAttrs appends the event's attributes, up to `"data":`.
func appendCloudEventAttrs(dst []byte, c *cdc.Change) []byte {
	dst = append(dst, `{"specversion":"1.0","id":"`...)
	dst = appendStringBody(dst, c.Producer)
	dst = append(dst, ':')
	dst = appendHex16(dst, uint64(c.CommitLSN))
	dst = append(dst, ':')
	dst = strconv.AppendUint(dst, uint64(c.Seq), 10)
	dst = append(dst, `","source":"/bridge/`...)
	dst = appendPathSegment(dst, c.Source)
	dst = append(dst, '/')
	dst = appendPathSegment(dst, c.Database)
	dst = append(dst, `","type":"`+CloudEventTypePrefix...)
	dst = appendStringBody(dst, string(c.Op))
	dst = append(dst, '"')
	switch {
	case c.Op == cdc.OpMessage:
		if strings.TrimSpace(c.Prefix) != "" {
			dst = append(dst, `,"subject":`...)
			dst = appendString(dst, c.Prefix)
		}
	case c.Schema != "" || c.Table != "":
		dst = append(dst, `,"subject":"`...)
		dst = appendStringBody(dst, c.Schema)
		dst = append(dst, '.')
		dst = appendStringBody(dst, c.Table)
		dst = append(dst, '"')
	}
	if !c.CommitTime.IsZero() {
		dst = append(dst, `,"time":`...)
		dst = appendCommitTime(dst, c.CommitTime)
	}
	dst = append(dst, `,"datacontenttype":"application/json","pglsn":`...)
	dst = appendLSN(dst, c.CommitLSN)
	dst = append(dst, `,"pgseq":"`...)
	dst = strconv.AppendUint(dst, uint64(c.Seq), 10)
	dst = append(dst, '"')
	if c.Xid != 0 {
		dst = append(dst, `,"pgxid":"`...)
		dst = strconv.AppendUint(dst, uint64(c.Xid), 10)
		dst = append(dst, '"')
	}
	if len(c.Headers) > 0 {
		if m, ok := c.Headers[HeaderMasked]; ok && m != "" {
			dst = append(dst, `,"pgmasked":`...)
			dst = appendString(dst, m)
		}
		if tp, ok := c.Headers["traceparent"]; ok {
			dst = append(dst, `,"traceparent":`...)
			dst = appendString(dst, tp)
		}
		if ts, ok := c.Headers["tracestate"]; ok {
			dst = append(dst, `,"tracestate":`...)
			dst = appendString(dst, ts)
		}
	}
	return append(dst, `,"data":`...)
}

// appendPathSegment appends s percent-encoded as an RFC 3986 path segment:
// unreserved characters, sub-delims, ':' and '@' are kept, every other byte
// becomes %XX. The output never needs JSON escaping.
func appendPathSegment(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if pchar[c] {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', upperHex[c>>4], upperHex[c&0xF])
	}
	return dst
}

// pchar[c] is true for the bytes a path segment holds unencoded.
var pchar = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "-._~!$&'()*+,;=:@" {
		t[c] = true
	}
	return t
}()
