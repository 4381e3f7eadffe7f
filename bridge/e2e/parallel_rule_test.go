package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryTestParallelOrSerial holds this package to doc.go's rule: each
// top-level test either starts with t.Parallel() or has a doc comment
// line that starts with Serial: and says why, never both and never
// neither, so that no new test slips into the serial group (and CI's
// time) or into the parallel one (and other tests' timing) undecided.
func TestEveryTestParallelOrSerial(t *testing.T) {
	t.Parallel()
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
				t.Errorf("%s: %s calls t.Parallel() but its doc comment says Serial: keep one", fset.Position(fd.Pos()), fd.Name.Name)
			case !parallel && !serial:
				t.Errorf("%s: %s neither starts with t.Parallel() nor says \"Serial:\" and why in its doc comment (doc.go: Parallel and serial tests)", fset.Position(fd.Pos()), fd.Name.Name)
			}
		}
	}
	if tests < 100 {
		t.Fatalf("found only %d tests in %d files: the check read the wrong directory", tests, len(files))
	}
}

func startsWithParallel(body *ast.BlockStmt) bool {
	if len(body.List) == 0 {
		return false
	}
	es, ok := body.List[0].(*ast.ExprStmt)
	if !ok {
		return false
	}
	ce, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	se, ok := ce.Fun.(*ast.SelectorExpr)
	return ok && se.Sel.Name == "Parallel"
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
