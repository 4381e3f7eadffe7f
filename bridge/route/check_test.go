package route

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bridgecdc/bridge/bridge/cdc"
	"github.com/bridgecdc/bridge/config"
)

// TestCheckTables: each route with shaping gets an ok line naming the
// tables it was checked against, or a failure per problem with the
// table's columns as the fix; routes of other sources, routes taking no
// rows and tables an earlier route takes whole are left out; a glob rule
// naming a column no table has fails.
func TestCheckTables(t *testing.T) {
	users := &cdc.Relation{Schema: "public", Table: "users", Columns: []cdc.Column{{Name: "id", Type: "int4", OID: 23, Key: true}, {Name: "email", Type: "text", OID: 25}}}
	rels := []*cdc.Relation{orders, users}
	cfg := &config.Config{Routes: []config.Route{
		{Match: config.Match{Tables: []string{"public.orders"}}, Filter: `after.total > 1.0`, Sinks: []string{"a"}},
		{Match: config.Match{Sources: []string{"other"}}, Filter: `after.nope`, Sinks: []string{"a"}},
		{Match: config.Match{Ops: []string{"message"}}, Filter: `after.nope`, Sinks: []string{"a"}},
		{Match: config.Match{Tables: []string{"public.users"}}, Sinks: []string{"a"}},                                  // takes users whole
		{Filter: `after.email != ""`, Columns: []config.Columns{{Exclude: []string{"pasword"}}}, Sinks: []string{"a"}}, // sees orders only
	}}
	got := CheckTables(cfg, "shop", rels)
	require.Len(t, got, 2, "%v", got)
	require.Equal(t, config.Check{Status: config.CheckOK, What: "routes[0] filter: checked against public.orders"}, got[0])
	require.Equal(t, config.CheckFail, got[1].Status)
	require.Equal(t, `routes[4].columns[0].exclude[0]: no table the rule applies to has a column "pasword"`, got[1].What)

	cfg.Routes[0].Filter = `after.totl > 1.0`
	got = CheckTables(cfg, "shop", rels)
	require.Equal(t, config.CheckFail, got[0].Status)
	require.Equal(t, "routes[0].filter:1:6: undefined field 'totl' (checked against public.orders)", got[0].What)
	require.Contains(t, got[0].Fix, "the columns of public.orders: id int4 (int, key), status text (string), total numeric (double)")

	cfg.Routes[0].Match.Tables = []string{"public.nothing"}
	got = CheckTables(cfg, "shop", rels)
	require.Equal(t, config.Check{Status: config.CheckWarn, What: "routes[0] filter: no table source shop streams reaches the route",
		Fix: "check the route's match.tables against the source's tables or publication, and the routes before it"}, got[0])
}
