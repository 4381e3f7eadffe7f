package route

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
	"github.com/bridgecdc/bridge/internal/testseed"
)

// secretText is a value no other part of a message can hold by chance:
// letters outside hex and base64's usual runs of a message.
func secretText(rng *rand.Rand, prefix string) string {
	const alpha = "ghijklmnopqrstuvwxyz"
	var b strings.Builder
	b.WriteString(prefix)
	for range 12 {
		b.WriteByte(alpha[rng.IntN(len(alpha))])
	}
	return b.String()
}

// propCol is a column of the property test's random tables and how to
// find its value in published bytes.
type propCol struct {
	col cdc.Column
	gen func(rng *rand.Rand, keep int) (v any, needles []string)
}

// propTypes are the column types the property test draws from; each
// value's needles are the texts that must not be published when the
// column is left out or masked (truncate: what is past the kept part).
var propTypes = []propCol{
	{cdc.Column{Type: "text", OID: 25}, func(rng *rand.Rand, keep int) (any, []string) {
		head := "ÿ" + strings.Repeat("é", keep) // multi-byte: truncation counts characters
		tail := secretText(rng, "t")
		return head[:len(head)-len("é")] + tail, []string{tail}
	}},
	{cdc.Column{Type: "varchar", OID: 1043}, func(rng *rand.Rand, keep int) (any, []string) {
		s := secretText(rng, strings.Repeat("v", keep))
		return s, []string{s[keep:]}
	}},
	{cdc.Column{Type: "jsonb", OID: 3802}, func(rng *rand.Rand, _ int) (any, []string) {
		s := secretText(rng, "j")
		return cdc.RawJSON(`{"k":"` + s + `"}`), []string{s}
	}},
	{cdc.Column{Type: "int8", OID: 20}, func(rng *rand.Rand, _ int) (any, []string) {
		v := int64(9e15) + rng.Int64N(9e14) // 16 digits from 9: no commit time or LSN holds them
		return v, []string{strconv.FormatInt(v, 10)}
	}},
	{cdc.Column{Type: "bytea", OID: 17}, func(rng *rand.Rand, keep int) (any, []string) {
		b := []byte(secretText(rng, strings.Repeat("b", keep)))
		return b, []string{string(b[keep:]), base64.StdEncoding.EncodeToString(b)}
	}},
}

// TestPropertyNoMaskedValuePublished: for random tables, rows and
// include/exclude/mask configurations, in every format, with and without a
// subject reading columns, no value a route leaves out or masks appears in
// any byte it publishes: payload, subject or headers.
func TestPropertyNoMaskedValuePublished(t *testing.T) {
	rng := rand.New(rand.NewPCG(testseed.Seed(t, "BRIDGE_PROPERTY_SEED"), 7))
	formats := []string{"native", "debezium", "cloudevents"}
	for iter := range 400 {
		// A table: a key column, then 2 to 8 columns of random types.
		rel := &cdc.Relation{Schema: "public", Table: fmt.Sprintf("t%d", iter), Columns: []cdc.Column{{Name: "id", Type: "int8", OID: 20, Key: true}}}
		var gens []propCol
		for i := range 2 + rng.IntN(7) {
			pc := propTypes[rng.IntN(len(propTypes))]
			pc.col.Name = fmt.Sprintf("c%d", i)
			rel.Columns = append(rel.Columns, pc.col)
			gens = append(gens, pc)
		}
		names := make([]string, len(gens))
		for i := range gens {
			names[i] = gens[i].col.Name
		}

		// A configuration: include or exclude some columns, mask some others.
		rc := config.Route{Format: formats[rng.IntN(len(formats))]}
		hidden := map[string]bool{} // left out
		masks := map[string]string{}
		trunc := map[string]int{}
		switch rng.IntN(3) {
		case 0:
			var inc []string
			for _, n := range names {
				if rng.IntN(2) == 0 {
					inc = append(inc, n)
				} else {
					hidden[n] = true
				}
			}
			if len(inc) == 0 {
				inc = []string{"id"}
			}
			rc.Columns = []config.Columns{{Include: inc}}
		case 1:
			var exc []string
			for _, n := range names {
				if rng.IntN(3) == 0 {
					exc = append(exc, n)
					hidden[n] = true
				}
			}
			if len(exc) > 0 {
				rc.Columns = []config.Columns{{Tables: []string{"public.*"}, Exclude: exc}}
			}
		}
		var m config.Mask
		for i, n := range names {
			if hidden[n] || rng.IntN(2) == 0 {
				continue
			}
			kind := []string{"redact", "hash", "truncate"}[rng.IntN(3)]
			if kind == "truncate" && gens[i].col.Type == "int8" || gens[i].col.Type == "jsonb" && kind == "truncate" {
				kind = "hash"
			}
			masks[n] = kind
			switch kind {
			case "redact":
				m.Redact = append(m.Redact, n)
			case "hash":
				m.Hash = append(m.Hash, n)
			case "truncate":
				trunc[n] = 1 + rng.IntN(4)
			}
		}
		if len(trunc) > 0 {
			m.Truncate = trunc
		}
		if len(m.Hash) > 0 {
			m.HashKey = testHashKey
		}
		if len(masks) > 0 {
			rc.Mask = []config.Mask{m}
		}
		// The subject may read a published column, masked or not.
		var visible []string
		for _, n := range names {
			if !hidden[n] && (masks[n] != "truncate" || rng.IntN(2) == 0) {
				visible = append(visible, n)
			}
		}
		if len(visible) > 0 && rng.IntN(2) == 0 {
			rc.Subject = "p.{{.Table}}.{{.Col." + visible[rng.IntN(len(visible))] + "}}.{{.Key.id}}"
		}
		r := newRouter(t, "drop", rc)

		// Changes: insert, update (unchanged TOAST values, full before
		// image), delete (key-only before image), snapshot read.
		row := func() ([]any, []string) {
			out := []any{int64(1 + rng.IntN(1000))}
			var needles []string
			for i, g := range gens {
				v, ns := g.gen(rng, trunc[names[i]])
				if rng.IntN(10) == 0 {
					v, ns = nil, nil
				}
				out = append(out, v)
				if hidden[names[i]] || masks[names[i]] != "" {
					needles = append(needles, ns...)
				}
			}
			return out, needles
		}
		after, n1 := row()
		before, n2 := row()
		before[0] = after[0]
		upd := slices.Clone(after)
		for i := 1; i < len(upd); i++ {
			if rng.IntN(4) == 0 {
				upd[i] = cdc.Unchanged
			}
		}
		keyOnly := make([]any, len(after))
		keyOnly[0] = after[0]
		for i := 1; i < len(keyOnly); i++ {
			keyOnly[i] = cdc.Absent
		}
		needles := append(n1, n2...)
		for _, c := range []*cdc.Change{
			change(cdc.OpInsert, rel, nil, after),
			change(cdc.OpUpdate, rel, before, upd),
			change(cdc.OpDelete, rel, keyOnly, nil),
			change(cdc.OpDelete, rel, before, nil),
			change(cdc.OpRead, rel, nil, after),
		} {
			_, ok, err := r.Route(c)
			require.NoError(t, err, "iteration %d, config %+v", iter, rc)
			require.True(t, ok)
			published := c.Subject + "\n" + string(c.Payload)
			for k, v := range c.Headers {
				published += "\n" + k + ": " + v
			}
			for _, n := range needles {
				require.NotContains(t, published, n, "iteration %d: a value of a left-out or masked column is published (config %+v, %s)", iter, rc, c.Op)
			}
		}
	}
}
