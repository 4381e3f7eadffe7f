// Package wasm runs a route's filter or transform written in WebAssembly,
// with wazero (pure Go, no cgo). A Module is one .wasm file, checked and
// compiled once (Load), called per change by any number of goroutines
// through a pool of instances (an instance is not safe for concurrent
// use), each call bounded in time and memory.
//
// The contract between the bridge and a module, version 1 (ABI), which
// docs/plugins.md describes for module authors:
//
//	export bridge_abi_v1: () -> ()          declares version 1
//	export memory                           the module's linear memory
//	export alloc: (size i32) -> i32         a buffer of size bytes that stays
//	                                        valid until the next alloc call
//	export filter: (ptr, len i32) -> i32    1 takes the change, 0 rejects it;
//	                                        anything else is an error
//	export transform: (ptr, len i32) -> i64 the new body at (ptr<<32 | len),
//	                                        valid until the next call; 0 drops
//	                                        the change; a negative value is an
//	                                        error
//
// For each change the host writes the change (the route's shaped change
// in the native JSON format) into the buffer alloc returned, and calls the
// function with its pointer and length; it calls alloc again only for a
// change larger than the buffer, so a module keeps that buffer until then
// (one call per change instead of two: each call costs a transition and
// a timeout watch). A module may import WASI preview 1 (stdout
// and stderr, clocks, random; no files, no sockets, no environment) and
// AssemblyScript's env.abort; nothing else. What a module writes to
// stdout and stderr during a call is logged; the last lines of stderr
// are the reason given in the error of a call that fails. A reactor's
// _initialize runs when an instance starts.
//
// Limits: each call has Config.Timeout (the instance is closed when it
// passes: wazero's WithCloseOnContextDone); each instance's memory is
// capped at Config.MaxMemory (WithMemoryLimitPages), so a module that
// needs more traps instead of taking the host's memory. An instance that
// traps, exits or runs out of time is discarded and a fresh one serves
// the next call; one that returns an error stays.
package wasm
