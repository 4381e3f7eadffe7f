// Command go-transform is a bridge route transform (wasm_transform) in Go,
// compiled to WebAssembly:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o transform.wasm .
//
// It turns an order's change into an event: {"event": "order.<op>",
// "order_id": ..., "status": ..., "total_cents": ...}. It drops the
// changes of draft orders, and fails a change whose total is not a number.
// The bridge's WASM contract, version 1 (docs/plugins.md#webassembly-transforms-and-filters):
//
//	bridge_abi_v1()                declares the contract version
//	alloc(size) -> ptr             a buffer the bridge writes changes into, kept
//	                               until the next alloc (called for a larger change)
//	transform(ptr, len) -> i64     the new body, (ptr << 32) | len; 0 drops the
//	                               change; -1 fails it, with the reason on stderr
//
// The change is the route's shaped change in the native JSON format
// (docs/formats.md): columns the route leaves out or masks never reach it.
package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"unsafe"
)

func main() {} // a WASI reactor: the bridge calls the exports below

//go:wasmexport bridge_abi_v1
func abiV1() {}

// in (until the next alloc) and out (until the next transform) keep the
// buffers handed to the bridge alive.
var in, out []byte

//go:wasmexport alloc
func alloc(size uint32) uint32 {
	if cap(in) < int(size) {
		in = make([]byte, size)
	}
	in = in[:size]
	if size == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&in[0])))
}

// change is what this transform reads of the native format.
type change struct {
	Op    string                     `json:"op"`
	Key   map[string]json.RawMessage `json:"key"`
	After *struct {
		Status string      `json:"status"`
		Total  json.Number `json:"total"`
	} `json:"after"`
}

// event is the body it publishes.
type event struct {
	Event      string          `json:"event"`
	OrderID    json.RawMessage `json:"order_id"`
	Status     string          `json:"status,omitempty"`
	TotalCents int64           `json:"total_cents"`
}

//go:wasmexport transform
func transform(ptr, size uint32) int64 {
	var c change
	if err := json.Unmarshal(in[:size], &c); err != nil {
		return fail("reading the change: %v", err)
	}
	e := event{Event: "order." + c.Op, OrderID: c.Key["id"]}
	if c.After != nil {
		if c.After.Status == "draft" {
			return 0 // drop: drafts are not published
		}
		total, err := c.After.Total.Float64()
		if err != nil {
			return fail("total %q is not a number", c.After.Total)
		}
		e.Status, e.TotalCents = c.After.Status, int64(math.Round(total*100))
	}
	var err error
	if out, err = json.Marshal(e); err != nil {
		return fail("writing the event: %v", err)
	}
	return int64(uintptr(unsafe.Pointer(&out[0])))<<32 | int64(len(out))
}

// fail writes the reason to stderr, where the bridge reads it, and returns
// the error result.
func fail(format string, args ...any) int64 {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	return -1
}
