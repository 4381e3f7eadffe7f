// A bridge route filter (wasm_filter) in AssemblyScript: it takes the
// changes whose new row has status "paid", and rejects the others (deletes
// and truncates, which have no new row, included). The bridge's WASM
// contract, version 1 (docs/plugins.md#webassembly-transforms-and-filters):
//
//   bridge_abi_v1()            declares the contract version
//   alloc(size) -> ptr         a buffer the bridge writes changes into, kept
//                              until the next alloc (called for a larger change)
//   filter(ptr, len) -> i32    1: take the change, 0: reject it
//
// The change is the route's shaped change in the native JSON format
// (docs/formats.md): columns the route leaves out or masks never reach it.

export function bridge_abi_v1(): void {}

// input keeps the buffer alloc handed out alive until the next alloc.
let input = new ArrayBuffer(0);

export function alloc(size: i32): usize {
  input = new ArrayBuffer(size);
  return changetype<usize>(input);
}

export function filter(ptr: usize, len: i32): i32 {
  const end = ptr + <usize>len;
  const start = ws(ptr, end);
  if (start >= end || load<u8>(start) != 0x7b) {
    // An error names what went wrong: AssemblyScript's abort, which the
    // bridge reports with the route, the table and the LSN.
    throw new Error("the change is not a JSON object");
  }
  const after = member(start, end, "after"); // 0 when after is null
  if (after == 0) return 0;
  const status = member(after, end, "status");
  if (status == 0) return 0;
  return isString(status, end, "paid") ? 1 : 0;
}

// A minimal JSON reader over the input bytes: enough to find a member.

const QUOTE: u8 = 0x22;
const BACKSLASH: u8 = 0x5c;

function isSpace(c: u8): bool {
  return c == 0x20 || c == 0x0a || c == 0x0d || c == 0x09;
}

function ws(p: usize, end: usize): usize {
  while (p < end && isSpace(load<u8>(p))) p++;
  return p;
}

// skipString returns the position after the string starting at p (its
// opening quote), or 0 when it does not end.
function skipString(p: usize, end: usize): usize {
  p++;
  while (p < end) {
    const c = load<u8>(p);
    if (c == BACKSLASH) {
      p += 2;
      continue;
    }
    p++;
    if (c == QUOTE) return p;
  }
  return 0;
}

// skipValue returns the position after the value starting at p, or 0.
function skipValue(p: usize, end: usize): usize {
  p = ws(p, end);
  if (p >= end) return 0;
  const c = load<u8>(p);
  if (c == QUOTE) return skipString(p, end);
  if (c == 0x7b || c == 0x5b) { // { [
    let depth = 0;
    while (p < end) {
      const d = load<u8>(p);
      if (d == QUOTE) {
        p = skipString(p, end);
        if (p == 0) return 0;
        continue;
      }
      if (d == 0x7b || d == 0x5b) depth++;
      else if (d == 0x7d || d == 0x5d) {
        depth--;
        if (depth == 0) return p + 1;
      }
      p++;
    }
    return 0;
  }
  while (p < end) { // a number, true, false, null
    const d = load<u8>(p);
    if (d == 0x2c || d == 0x7d || d == 0x5d || isSpace(d)) break;
    p++;
  }
  return p;
}

// member returns the position of the value of key in the object at p, or 0
// when p is not an object (null, say) or has no such member.
function member(p: usize, end: usize, key: string): usize {
  p = ws(p, end);
  if (p >= end || load<u8>(p) != 0x7b) return 0;
  p++;
  while (true) {
    p = ws(p, end);
    if (p >= end) return 0;
    const c = load<u8>(p);
    if (c == 0x7d) return 0; // }
    if (c == 0x2c) { // ,
      p++;
      continue;
    }
    if (c != QUOTE) return 0;
    const ke = skipString(p, end);
    if (ke == 0) return 0;
    const match = equals(p + 1, ke - 1, key);
    p = ws(ke, end);
    if (p >= end || load<u8>(p) != 0x3a) return 0; // :
    p = ws(p + 1, end);
    if (match) return p;
    p = skipValue(p, end);
    if (p == 0) return 0;
  }
}

// equals reports whether the bytes [p, e) are the ASCII string s.
function equals(p: usize, e: usize, s: string): bool {
  if (<i32>(e - p) != s.length) return false;
  for (let i = 0; i < s.length; i++) {
    if (<i32>load<u8>(p + <usize>i) != s.charCodeAt(i)) return false;
  }
  return true;
}

// isString reports whether the value at p is the JSON string s (ASCII,
// without escapes).
function isString(p: usize, end: usize, s: string): bool {
  if (load<u8>(p) != QUOTE) return false;
  const e = skipString(p, end);
  return e != 0 && equals(p + 1, e - 1, s);
}
