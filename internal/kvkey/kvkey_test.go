package kvkey

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"testing/quick"
)

// keyToken is what NATS accepts in one token of a KV key.
var keyToken = regexp.MustCompile(`^[-/_=a-zA-Z0-9]+$`)

func TestEscapeExamples(t *testing.T) {
	for in, want := range map[string]string{
		"":               "=",
		"42":             "42",
		"ada":            "ada",
		"Ada_Lovelace-1": "Ada_Lovelace-1",
		"a.b":            "a=2Eb",
		"a b":            "a=20b",
		"=":              "=3D",
		"/":              "=2F",
		"ü":              "=C3=BC",
		"日本":             "=E6=97=A5=E6=9C=AC",
		"1.5":            "1=2E5",
		"*>":             "=2A=3E",
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
		back, err := Unescape(want)
		if err != nil || back != in {
			t.Errorf("Unescape(%q) = %q, %v; want %q", want, back, err, in)
		}
	}
}

// TestRoundTrip: for any bytes, Escape gives one valid key token that
// Unescape turns back into them, and distinct strings never share a token.
func TestRoundTrip(t *testing.T) {
	seen := map[string]string{}
	check := func(s string) bool {
		tok := Escape(s)
		if !keyToken.MatchString(tok) || strings.Contains(tok, ".") {
			t.Errorf("Escape(%q) = %q: not one valid key token", s, tok)
			return false
		}
		if string(Append(nil, s)) != tok {
			t.Errorf("Append(%q) = %q, Escape %q", s, Append(nil, s), tok)
			return false
		}
		back, err := Unescape(tok)
		if err != nil || back != s {
			t.Errorf("Unescape(Escape(%q)) = %q, %v", s, back, err)
			return false
		}
		if prev, ok := seen[tok]; ok && prev != s {
			t.Errorf("%q and %q share the token %q", prev, s, tok)
			return false
		}
		seen[tok] = s
		return true
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 20000}); err != nil {
		t.Fatal(err)
	}
	// Strings from a small alphabet rich in the bytes that must be escaped,
	// so that near-collisions ("=3D" written out, '.' against "=2E") occur.
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"", "=", ".", "3", "D", "2", "E", "a", "_", "-", "/", "ü", "\x00", "\xff", " "}
	for range 50000 {
		var b strings.Builder
		for range r.IntN(8) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		if !check(b.String()) {
			return
		}
	}
}

// TestUnescapeRefuses: only what Escape returns is accepted, so a token
// has one meaning.
func TestUnescapeRefuses(t *testing.T) {
	for _, tok := range []string{"", "a.b", "a b", "=2", "=", "=3d", "=41", "=G0", "x=", "ü", "=2E="} {
		if tok == "=" {
			continue // the empty string
		}
		if s, err := Unescape(tok); err == nil {
			t.Errorf("Unescape(%q) = %q, want an error", tok, s)
		}
	}
	// Every accepted token is Escape's output for what it decodes to:
	// random tokens over the key alphabet, '=' and hex digits frequent.
	r := rand.New(rand.NewPCG(3, 4))
	const alphabet = "==3D2E4F0aZ_-/."
	accepted := 0
	for range 100000 {
		b := make([]byte, 1+r.IntN(7))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		tok := string(b)
		s, err := Unescape(tok)
		if err != nil {
			continue
		}
		accepted++
		if Escape(s) != tok {
			t.Fatalf("Unescape(%q) = %q, but Escape(%q) = %q: two tokens for one string", tok, s, s, Escape(s))
		}
	}
	if accepted < 1000 {
		t.Fatalf("only %d of the random tokens were valid: the test checks too little", accepted)
	}
}
