package e2e_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryTestParallelOrSerial holds this package to doc.go's rule: each
// top-level test either starts with `defer parallel(t)()` (or
// parallelLong) or has a doc comment line that starts with Serial: and
// says why, never both and never neither, so that no new test slips into
// the serial group (and CI's time) or into the parallel one (and other
// tests' timing) undecided. And no test calls t.Parallel() itself: only
// the gate in sched_test.go does, which bounds how many run at once.
func TestEveryTestParallelOrSerial(t *testing.T) {
	defer parallel(t)()
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("listing the package's test files: %v (%d files)", err, len(files))
	}
	fset := token.NewFileSet()
	tests := 0
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatalf("parsing %s: %v", f, err)
		}
		if f != "sched_test.go" {
			ast.Inspect(af, func(n ast.Node) bool {
				if se, ok := n.(*ast.SelectorExpr); ok && se.Sel.Name == "Parallel" {
					t.Errorf("%s: t.Parallel() called directly: start the test with `defer parallel(t)()` (sched_test.go), "+
						"or go test's own -parallel, which the gate raises, no longer bounds it", fset.Position(se.Pos()))
				}
				return true
			})
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || !strings.HasPrefix(fd.Name.Name, "Test") || fd.Body == nil ||
				fd.Name.Name == "TestMain" { // the package's setup, not a test
				continue
			}
			tests++
			parallel := startsWithParallel(fd.Body)
			serial := fd.Doc != nil && saysSerial(fd.Doc.Text())
			switch {
			case parallel && serial:
				t.Errorf("%s: %s starts with defer parallel(t)() but its doc comment says Serial: keep one", fset.Position(fd.Pos()), fd.Name.Name)
			case !parallel && !serial:
				t.Errorf("%s: %s neither starts with `defer parallel(t)()` nor says \"Serial:\" and why in its doc comment (doc.go: Parallel and serial tests)", fset.Position(fd.Pos()), fd.Name.Name)
			}
		}
	}
	if tests < 100 {
		t.Fatalf("found only %d tests in %d files: the check read the wrong directory", tests, len(files))
	}
}

// startsWithParallel reports whether body's first statement is
// `defer parallel(t)()` or `defer parallelLong(t)()`.
func startsWithParallel(body *ast.BlockStmt) bool {
	if len(body.List) == 0 {
		return false
	}
	ds, ok := body.List[0].(*ast.DeferStmt)
	if !ok {
		return false
	}
	inner, ok := ds.Call.Fun.(*ast.CallExpr)
	if !ok {
		return false
	}
	id, ok := inner.Fun.(*ast.Ident)
	return ok && (id.Name == "parallel" || id.Name == "parallelLong")
}

// saysSerial reports whether a doc comment has a line that starts with
// "Serial:".
func saysSerial(doc string) bool {
	for _, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "Serial:") {
			return true
		}
	}
	return false
}
