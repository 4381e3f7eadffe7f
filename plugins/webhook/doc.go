// Package webhook is the "webhook" sink, and the example to copy when
// writing a sink of your own: it POSTs changes as JSON to an HTTP endpoint.
//
// With batch: true (the default) each Write is one request whose body is a
// JSON array of envelopes, one per change, in order; with batch: false each
// change is its own request whose body is one envelope, sent in order, the
// next only after the previous one succeeded. An envelope is
//
//	{"id": "<producer>:<commit LSN, 16 hex>:<seq>", "subject": "...",
//	 "headers": {"traceparent": "..."}, "payload": <the change>}
//
// where payload is the change as the route's format encoded it, embedded
// verbatim when it is JSON (every built-in format is), or base64 in
// "payload_base64" when it is not. Every request carries Content-Type:
// application/json, the configured headers, and an Idempotency-Key: the
// change's id, or "<first id>..<last id>" for a batch; receivers drop
// requests and envelopes whose id they have already seen, because a retry
// sends the same ones again. With batch: false the change's own headers
// (W3C traceparent etc.) are sent as request headers too, where they do
// not clash with the others.
//
// Outcomes: 2xx means delivered. 4xx other than 408 and 429 is permanent
// (the pipeline stops, naming the change): the receiver refused the data or
// the credentials, and resending will not change its mind. A 3xx is
// permanent too: redirects are not followed, set url to the final
// location. 408, 429, 5xx, timeouts and network errors are retried with
// backoff. With batch: false a failure is reported per change (the one
// that failed, and every later one, which was not sent). The start of a
// refusing answer (256 bytes) is quoted in the error, with the configured
// headers' values and the url's password replaced by xxxxx, should the
// receiver echo them. An http:// url to a host other than this machine is
// warned about at start: rows and headers would cross the network in
// clear.
//
// Example (bridge.yaml):
//
//	sinks:
//	  hooks:
//	    type: webhook
//	    batch: { max_changes: 100 }          # framework key: changes per request with batch: true
//	    config:
//	      url: https://hooks.example.com/cdc # required; http or https
//	      batch: true                        # one request per batch; false: one per change
//	      timeout: 5s                        # per request; default 10s
//	      headers:                           # added to every request; values never logged
//	        Authorization: "Bearer ${HOOK_TOKEN}"
package webhook
