package wasm_test

import (
	"testing"
	"time"

	"github.com/bridgecdc/bridge/bridge/wasm"
	"github.com/bridgecdc/bridge/internal/wasmtest"
)

// BenchmarkCall calls a module's function on a change: the cost of the
// call itself (the AssemblyScript filter does little), of a Go module's
// call (seven returns at once, an error result; echo copies its input),
// and of the Go transform example (JSON in
// and out with encoding/json).
func BenchmarkCall(b *testing.B) {
	in := change("paid")
	for _, bc := range []struct {
		name, path, fn string
		kind           wasm.Kind
	}{
		{"as-filter", wasmtest.ASFilter(b), "filter", wasm.Filter},
		{"go-noop", wasmtest.GoModule(b, "testdata/guest"), "seven", wasm.Filter},
		{"go-echo", wasmtest.GoModule(b, "testdata/guest"), "echo", wasm.Transform},
		{"go-transform", wasmtest.GoTransform(b), "transform", wasm.Transform},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m, err := wasm.Load(b.Context(), bc.kind, wasm.Config{At: "x", Module: bc.path, SHA256: wasmtest.SHA256(b, bc.path), Function: bc.fn, Timeout: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			var buf []byte
			for b.Loop() {
				if bc.kind == wasm.Filter {
					_, err = m.Filter(b.Context(), in)
				} else {
					buf, _, err = m.Transform(b.Context(), in, buf[:0])
				}
				if err != nil && bc.fn != "seven" { // seven's result is an error, after a whole call
					b.Fatal(err)
				}
			}
		})
	}
}
