package route

import (
	"testing"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// BenchmarkFilter evaluates a three-clause filter on a ten-column row,
// compiled for the row's relation as Route runs it.
func BenchmarkFilter(b *testing.B) {
	s, errs := newShaper(0, routeWithFilter(`op != "delete" && after.status in ["paid", "shipped"] && after.total > 100.0`), nil, options{})
	if errs != nil {
		b.Fatal(errs)
	}
	c := change(cdc.OpUpdate, orders, nil, orderRow(7, "paid", "150.25"))
	rs := s.shapeFor(orders)
	if rs.err != nil {
		b.Fatal(rs.err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if ok, err := evalFilter(rs.filter, c, rs); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}
