package dbroles_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"
)

// realQuery returns the statement that constant name holds in internal/<pkg>/queries.go, read
// from the source, so the roles tests run exactly what the role runs. The statements are
// unexported (no package exports its SQL), and a copy here would drift from the real one
// unnoticed; a renamed or removed constant fails the test instead.
func realQuery(t *testing.T, pkg, name string) string {
	t.Helper()
	path := filepath.Join("..", pkg, "queries.go")
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("read the statements of %s: %v", pkg, err)
	}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if n.Name != name || i >= len(vs.Values) {
					continue
				}
				// The convention (cmd/harmonia-ci TestSQLLivesInQueries) writes every
				// statement as one literal.
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("%s.%s is not a string literal", pkg, name)
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatalf("%s.%s: %v", pkg, name, err)
				}
				return s
			}
		}
	}
	t.Fatalf("no statement %s in %s", name, path)
	return ""
}
