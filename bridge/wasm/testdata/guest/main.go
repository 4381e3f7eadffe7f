// Command guest is a module of the bridge's WASM contract that misbehaves
// on purpose, one export per way, for the tests of bridge/wasm and
// bridge/route. Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
package main

import (
	"fmt"
	"os"
	"unsafe"
)

func main() {}

//go:wasmexport bridge_abi_v1
func abiV1() {}

var in, out []byte

//go:wasmexport alloc
func alloc(size uint32) uint32 {
	in = make([]byte, size+1)
	return uint32(uintptr(unsafe.Pointer(&in[0])))
}

func result(b []byte) int64 {
	out = b
	return int64(uintptr(unsafe.Pointer(&out[0])))<<32 | int64(len(out))
}

// echo returns the change it was given: what the bridge sends.
//
//go:wasmexport echo
func echo(ptr, size uint32) int64 {
	if size < 200 {
		fmt.Println("echo called") // stdout is logged
	}
	return result(append([]byte(nil), in[:size]...))
}

// loop never returns.
//
//go:wasmexport loop
func loop(ptr, size uint32) int32 {
	for {
		spins++
	}
}

var spins int

var hog [][]byte

// hog allocates until the memory runs out.
//
//go:wasmexport hog
func hogMemory(ptr, size uint32) int32 {
	for {
		hog = append(hog, make([]byte, 1<<20))
	}
}

// boom panics.
//
//go:wasmexport boom
func boom(ptr, size uint32) int32 {
	panic("boom on a change of " + fmt.Sprint(size) + " bytes")
}

// seven returns a filter result that is neither 0 nor 1.
//
//go:wasmexport seven
func seven(ptr, size uint32) int32 { return 7 }

// notjson returns a body that is not a JSON object.
//
//go:wasmexport notjson
func notjson(ptr, size uint32) int64 { return result([]byte("hello")) }

// refuse fails the change with a reason on stderr.
//
//go:wasmexport refuse
func refuse(ptr, size uint32) int64 {
	fmt.Fprintln(os.Stderr, "debug: looking at the change")
	fmt.Fprintln(os.Stderr, "refused: the order has no customer")
	return -1
}

// drop drops every change.
//
//go:wasmexport drop
func drop(ptr, size uint32) int64 { return 0 }

// badfilter has the wrong signature for a filter.
//
//go:wasmexport badfilter
func badfilter(ptr uint32) int32 { return 1 }
