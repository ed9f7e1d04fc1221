package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// sqlStatement matches a string that is a SQL statement rather than prose: the verb, then what
// only a statement has after it (INSERT INTO, UPDATE t SET, DELETE FROM, WITH name AS (, a
// SELECT's FROM, parameter or call, SET name =). An error message such as
// "update project %d: %w" is not.
var sqlStatement = regexp.MustCompile(`(?is)^\s*(?:` +
	`select\s.*(?:\bfrom\b|\$\d|\w\()` +
	`|insert\s+into\s` +
	`|update\s+\w+(?:\s+\w+)?\s+set\s` +
	`|delete\s+from\s` +
	`|set\s+(?:local\s+|session\s+)?\w+\s*(?:=|to\s)` +
	`|with\s+(?:recursive\s+)?\w+(?:\s*\([^)]*\))?\s+as\s+(?:not\s+)?(?:materialized\s+)?\()`)

// Every SQL statement of the product is a package-level constant, named sql…, in its package's
// queries.go, written whole: no constant there is built with +, and no statement is finished at
// a call site. Code that runs statements on a pool or a transaction takes a db.DBTX, not an
// interface of its own. Tests may write their own SQL; the benchmarks are held to it too.
func TestSQLLivesInQueries(t *testing.T) {
	fset := token.NewFileSet()
	err := filepath.WalkDir("../../internal", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if strings.HasSuffix(f.Name.Name, "test") { // dbtest, queuetest, …: test helpers
			return nil
		}
		for _, v := range sqlViolations(fset, f, filepath.Base(p) == "queries.go") {
			t.Error(v)
		}
		if filepath.Base(filepath.Dir(p)) != "db" {
			for _, v := range dbtxViolations(fset, f) {
				t.Error(v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sqlViolations lists where f breaks the convention; queries says whether f is a queries.go.
func sqlViolations(fset *token.FileSet, f *ast.File, queries bool) []string {
	var out []string
	bad := func(n ast.Node, format string, args ...any) {
		out = append(out, fset.Position(n.Pos()).String()+": "+fmt.Sprintf(format, args...))
	}
	// The literals that are the whole value of a package-level const in queries.go.
	allowed := map[*ast.BasicLit]bool{}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || (g.Tok != token.CONST && g.Tok != token.VAR) {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, v := range vs.Values {
				if queries && g.Tok == token.CONST {
					if lit, ok := v.(*ast.BasicLit); ok && isSQL(lit) {
						allowed[lit] = true
						if name := vs.Names[i].Name; !isSQLName(vs.Names[i]) {
							bad(vs.Names[i], "SQL constant %s: name it sql…", name)
						}
					}
				}
				if queries {
					ast.Inspect(v, func(n ast.Node) bool {
						if b, ok := n.(*ast.BinaryExpr); ok && b.Op == token.ADD {
							bad(b, "%s is concatenated: write the statement whole", vs.Names[i].Name)
							return false
						}
						return true
					})
				}
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if isSQL(n) && !allowed[n] {
				where := "outside queries.go"
				if queries {
					where = "not a package-level constant"
				}
				bad(n, "SQL %s: %q", where, head(n))
			}
		case *ast.BinaryExpr: // sqlX + "…": a statement finished at a call site
			if n.Op == token.ADD && (isSQLName(n.X) || isSQLName(n.Y)) {
				bad(n, "SQL constant concatenated")
			}
		case *ast.AssignStmt: // q += …
			if n.Tok == token.ADD_ASSIGN && (isSQLName(n.Lhs[0]) || isSQLName(n.Rhs[0])) {
				bad(n, "SQL constant concatenated")
			}
		case *ast.CallExpr: // fmt.Sprintf(sqlX, …), strings.Replace(sqlX, …)
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
				if pkg, ok := sel.X.(*ast.Ident); ok && (pkg.Name == "fmt" || pkg.Name == "strings") {
					for _, a := range n.Args {
						if isSQLName(a) {
							bad(n, "SQL constant rewritten by %s.%s", pkg.Name, sel.Sel.Name)
						}
					}
				}
			}
		}
		return true
	})
	return out
}

// head is the start of lit's statement, on one line.
func head(lit *ast.BasicLit) string {
	s, _ := strconv.Unquote(lit.Value)
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 50 {
		s = s[:50] + "…"
	}
	return s
}

func isSQL(lit *ast.BasicLit) bool {
	if lit.Kind != token.STRING {
		return false
	}
	s, err := strconv.Unquote(lit.Value)
	return err == nil && sqlStatement.MatchString(s)
}

// dbtxViolations lists the interfaces in f that declare a statement method (Exec, Query,
// QueryRow): db.DBTX is the one.
func dbtxViolations(fset *token.FileSet, f *ast.File) []string {
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		it, ok := n.(*ast.InterfaceType)
		if !ok {
			return true
		}
		for _, m := range it.Methods.List {
			for _, name := range m.Names {
				switch name.Name {
				case "Exec", "Query", "QueryRow":
					out = append(out, fmt.Sprintf("%s: an interface with %s: take a db.DBTX", fset.Position(name.Pos()), name.Name))
				}
			}
		}
		return true
	})
	return out
}

// isSQLName says whether e names a SQL constant by the convention: sql, then a capital.
func isSQLName(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && len(id.Name) > 3 && strings.HasPrefix(id.Name, "sql") && id.Name[3] >= 'A' && id.Name[3] <= 'Z'
}

func TestDBTXViolations(t *testing.T) {
	tests := []struct {
		name    string
		src     string
		wantBad int
	}{
		{"a querier", "type querier interface {\n\tQuery(ctx context.Context, sql string, args ...any) (pgx.Rows, error)\n}", 1},
		{"inline", "func f(q interface {\n\tQueryRow(context.Context, string, ...any) pgx.Row\n}) {}", 1},
		{"db.DBTX", "func f(q db.DBTX) {}", 0},
		{"other methods", "type beginner interface {\n\tBegin(ctx context.Context) (pgx.Tx, error)\n}", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "x.go", "package p\n"+tt.src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			if got := dbtxViolations(fset, f); len(got) != tt.wantBad {
				t.Errorf("%d violations %q, want %d", len(got), got, tt.wantBad)
			}
		})
	}
}

func TestSQLViolations(t *testing.T) {
	tests := []struct {
		name    string
		file    string // queries.go or another name
		src     string
		wantBad int
	}{
		{"prose", "job.go", `func f(id int, err error) error { return fmt.Errorf("update project %d: %w", id, err) }`, 0},
		{"prose select", "job.go", `const msg = "select a project"`, 0},
		{"named constant", "queries.go", "const sqlJobCancel = `UPDATE build_jobs SET status = 'cancelled' WHERE id = $1`", 0},
		{"DDL", "queries.go", "const sqlCreate = `CREATE TABLE t (id int)`", 0},
		{"outside queries.go", "job.go", "const sqlJobCancel = `DELETE FROM build_jobs WHERE id = $1`", 1},
		{"at the call site", "job.go", "func f() { pool.QueryRow(ctx, `SELECT status FROM build_jobs WHERE id = $1`, 1) }", 1},
		{"a variable", "queries.go", "var sqlList = `SELECT id FROM projects`", 1},
		{"in a function", "queries.go", "func q() string { return `WITH x AS (SELECT 1) SELECT * FROM x` }", 1},
		{"misnamed", "queries.go", "const listSQL = `SELECT id FROM projects`", 1},
		{"misnamed sql", "queries.go", "const sqllist = `SELECT id FROM projects`", 1},
		{"column list", "queries.go", "const (\n\tcols = `id, name`\n\tsqlList = `SELECT ` + cols + ` FROM projects`\n)", 1},
		{"finished by +", "job.go", "func f() { pool.Query(ctx, sqlList+` WHERE id = $1`) }", 1},
		{"finished by +=", "job.go", "func f() { q := ``; q += sqlList }", 1},
		{"finished by Sprintf", "job.go", `func f() { pool.Query(ctx, fmt.Sprintf(sqlList, "id")) }`, 1},
		{"SET by Sprintf", "job.go", `func f() { tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", 5)) }`, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, tt.file, "package p\n"+tt.src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			if got := sqlViolations(fset, f, tt.file == "queries.go"); len(got) != tt.wantBad {
				t.Errorf("%d violations %q, want %d", len(got), got, tt.wantBad)
			}
		})
	}
}
