package wal2json

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

func TestParseMessage(t *testing.T) {
	var ps jsonParser
	m, err := ps.parse([]byte(`{"action":"U","xid":4294967295,"timestamp":null,"lsn":"0/154B268","nextlsn":"1/2","schema":"s\"q","table":"t\u00e9",` +
		`"columns":[{"name":"id","type":"integer","typeoid":23,"value":-1.5e3,"optional":false},{"name":"b","type":"text","typeoid":25,"value":"a\"\\b\u00e9","optional":true},{"name":"n","type":"text","value":null}],` +
		`"identity":[{"name":"id","type":"integer","typeoid":23,"value":7}],"pk":[{"name":"id","type":"integer","typeoid":23}],"unknown":{"x":[1]}}`))
	require.NoError(t, err)
	require.Equal(t, "U", m.Action)
	require.Equal(t, uint32(4294967295), m.Xid)
	require.Nil(t, m.Timestamp)
	require.Equal(t, "0/154B268", string(m.LSN))
	require.Equal(t, "1/2", string(m.NextLSN))
	require.Equal(t, `s"q`, string(m.Schema))
	require.Equal(t, "té", string(m.Table))
	require.Len(t, m.Columns, 3)
	c := m.Columns
	require.Equal(t, []string{"id", "integer", "-1.5e3"}, []string{string(c[0].Name), string(c[0].Type), string(c[0].Value)})
	require.Equal(t, uint32(23), c[0].TypeOID)
	require.True(t, c[0].notNull())
	// A string value is kept as its JSON text, escapes and all, for unquote.
	require.Equal(t, `"a\"\\b\u00e9"`, string(c[1].Value))
	require.False(t, c[1].notNull())
	require.Equal(t, "null", string(c[2].Value))
	require.Zero(t, c[2].TypeOID)
	require.False(t, c[2].HasOpt)
	require.Len(t, m.Identity, 1)
	require.Equal(t, "7", string(m.Identity[0].Value))
	require.Len(t, m.PK, 1)
	require.Nil(t, m.PK[0].Value)

	// The next object starts from nothing: no field of the last survives.
	m, err = ps.parse([]byte(`{"action":"M","transactional":true,"prefix":"app","content":"x\ny"}`))
	require.NoError(t, err)
	require.Equal(t, "M", m.Action)
	require.Zero(t, m.Xid)
	require.Nil(t, m.LSN)
	require.Nil(t, m.Schema)
	require.Empty(t, m.Columns)
	require.Empty(t, m.Identity)
	require.Empty(t, m.PK)
	require.True(t, m.Transactional)
	require.Equal(t, "app", string(m.Prefix))
	require.Equal(t, `"x\ny"`, string(m.Content))
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"action":`, "cannot parse JSON"},
		{`[1]`, "not a JSON object"},
		{`{"action":1}`, `"action"`},
		{`{"action":"B","xid":"1"}`, `"xid"`},
		{`{"action":"B","xid":4294967296}`, `"xid": 4294967296 does not fit 32 bits`},
		{`{"action":"B","xid":-1}`, `"xid"`},
		{`{"action":"I","columns":{}}`, `"columns"`},
		{`{"action":"I","columns":[1]}`, `"columns": element 0`},
		{`{"action":"I","identity":[{"name":"a"},{"name":2}]}`, `"identity": element 1: "name"`},
		{`{"action":"I","columns":[{"name":"a","typeoid":"x"}]}`, `"typeoid"`},
	} {
		var ps jsonParser
		_, err := ps.parse([]byte(tc.in))
		require.ErrorContains(t, err, tc.want, tc.in)
	}
}

func TestParseLSN(t *testing.T) {
	for _, s := range []string{"0/154B0C8", "16/B374D848", "ffffffff/FFFFFFFF", "0/0", "1234ABCD",
		"", "/", "0/", "/1", "1/2/3", "123456789/0", "0/123456789", "g/0", "0/1x", " 0/1"} {
		want, wantErr := cdc.ParseLSN(s)
		got, err := parseLSN([]byte(s))
		if wantErr != nil {
			require.EqualError(t, err, wantErr.Error(), s)
			continue
		}
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
}

// TestDecodeKeepsNothingOfTheInput: the parser reuses its memory for each
// object, and the caller may reuse the input; a change decoded earlier must
// not change with them.
func TestDecodeKeepsNothingOfTheInput(t *testing.T) {
	d := testDecoder(catalog(), "app")
	var txs []*cdc.Txn
	for _, s := range []string{
		`{"action":"B","xid":1,"nextlsn":"0/10"}`,
		`{"action":"I","lsn":"0/5","schema":"public","table":"items","columns":[{"name":"id","typeoid":23,"value":1},{"name":"name","typeoid":25,"value":"first\"one"},{"name":"qty","typeoid":23,"value":2}]}`,
		`{"action":"M","lsn":"0/6","transactional":true,"prefix":"app","content":"message one"}`,
		`{"action":"I","lsn":"0/7","schema":"public","table":"items","columns":[{"name":"id","typeoid":23,"value":3},{"name":"name","typeoid":25,"value":"SECOND"},{"name":"qty","typeoid":23,"value":4}]}`,
		`{"action":"M","lsn":"0/8","transactional":true,"prefix":"app","content":"MESSAGE TWO"}`,
		`{"action":"C","nextlsn":"0/20"}`,
	} {
		in := []byte(s)
		tx, err := d.Decode(t.Context(), 1, in)
		require.NoError(t, err, s)
		copy(in, bytes.Repeat([]byte{'#'}, len(in)))
		if tx != nil {
			txs = append(txs, tx)
		}
	}
	require.Len(t, txs, 1)
	ch := txs[0].Changes
	require.Len(t, ch, 4)
	require.Equal(t, []any{int64(1), `first"one`, int64(2)}, ch[0].After)
	require.Equal(t, "message one", string(ch[1].Content))
	require.Equal(t, []any{int64(3), "SECOND", int64(4)}, ch[2].After)
	require.Equal(t, "MESSAGE TWO", string(ch[3].Content))
	for _, c := range []cdc.Change{ch[0], ch[2]} {
		require.Equal(t, "public", c.Schema)
		require.Equal(t, "items", c.Table)
	}
	require.False(t, strings.Contains(ch[1].Prefix, "#"))
}
