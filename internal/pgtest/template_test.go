package pgtest

import (
	"context"
	"testing"
)

// TestTemplateCopies: clusters started in a test are copies of one initdb
// (the same system identifier) and yet separate clusters (what one
// creates, the other does not have); OwnSystem gives a cluster a system
// identifier of its own.
func TestTemplateCopies(t *testing.T) {
	ctx := context.Background()
	sysid := func(s *Server) string {
		var id string
		if err := s.Conn(t, "").QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	a, b := StartT(t, Options{}), StartT(t, Options{})
	own := StartT(t, Options{OwnSystem: true})
	if sysid(a) != sysid(b) {
		t.Fatalf("two copies of the template have system identifiers %s and %s", sysid(a), sysid(b))
	}
	if sysid(own) == sysid(a) {
		t.Fatalf("OwnSystem: the cluster has the template's system identifier %s", sysid(a))
	}
	a.ExecT(t, `CREATE TABLE only_in_a (id int)`)
	var n int
	if err := b.Conn(t, "").QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'only_in_a'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("a table created in one copy of the template is in another")
	}
}
