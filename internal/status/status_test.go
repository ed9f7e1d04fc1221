package status_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Every constant the package declares is in its type's All set, so that TestSetsMatchSchema
// sees a constant added in Go.
func TestAllListsEveryConstant(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "status.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string][]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			typ, ok := v.Type.(*ast.Ident)
			if !ok || len(v.Values) != 1 {
				t.Fatalf("constant %s: want a typed status with one string value", v.Names[0])
			}
			word, err := strconv.Unquote(v.Values[0].(*ast.BasicLit).Value)
			if err != nil {
				t.Fatal(err)
			}
			declared[typ.Name] = append(declared[typ.Name], word)
		}
	}
	tests := []struct {
		typ string
		all []string
	}{
		{"JobStatus", strs(status.AllJobs())},
		{"EvalStatus", strs(status.AllEvals())},
		{"NodeStatus", strs(status.AllNodes())},
		{"GCRunStatus", strs(status.AllGCRuns())},
		{"AttemptStatus", strs(status.AllAttempts())},
		{"UnitStatus", strs(status.AllUnits())},
	}
	if len(declared) != len(tests) {
		t.Errorf("status.go declares constants of %d types, the test knows %d", len(declared), len(tests))
	}
	for _, tt := range tests {
		if got := slices.Sorted(slices.Values(declared[tt.typ])); !slices.Equal(got, tt.all) {
			t.Errorf("status.go declares %s %q, its All set has %q", tt.typ, got, tt.all)
		}
	}
}

// strs turns a set of statuses into the words the schema spells.
func strs[S ~string](set []S) []string {
	out := make([]string, len(set))
	for i, s := range set {
		out[i] = string(s)
	}
	slices.Sort(out)
	return out
}

// Each status CHECK of the migrated schema allows exactly the Go set of its column: a word
// added to or dropped from either side fails here.
func TestSetsMatchSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := dbtest.NewPool(t)

	tests := []struct {
		name  string
		table string
		// expr matches the constraint's condition on status, as pg_get_constraintdef prints it;
		// its one group is the ARRAY's elements.
		expr *regexp.Regexp
		want []string
	}{
		{"jobs", "build_jobs", regexp.MustCompile(`\(status = ANY \(ARRAY\[([^\]]*)\]\)\)`), strs(status.AllJobs())},
		{"claimed jobs", "build_jobs", regexp.MustCompile(`\(status <> ALL \(ARRAY\[([^\]]*)\]\)\)`), strs(claimed())},
		{"evaluations", "evaluations", regexp.MustCompile(`\(status = ANY \(ARRAY\[([^\]]*)\]\)\)`), strs(status.AllEvals())},
		{"nodes", "nodes", regexp.MustCompile(`\(status = ANY \(ARRAY\[([^\]]*)\]\)\)`), strs(status.AllNodes())},
		{"gc runs", "gc_runs", regexp.MustCompile(`\(status = ANY \(ARRAY\[([^\]]*)\]\)\)`), strs(status.AllGCRuns())},
		{"attempts", "build_attempts", regexp.MustCompile(`\(status = ANY \(ARRAY\[([^\]]*)\]\)\)`), strs(status.AllAttempts())},
		{"units", "eval_units", regexp.MustCompile(`\(status = ANY \(ARRAY\[([^\]]*)\]\)\)`), strs(status.AllUnits())},
	}
	word := regexp.MustCompile(`'([^']*)'::text`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := pool.Query(ctx, `
SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
WHERE c.conrelid = $1::regclass AND c.contype = 'c'`, tt.table)
			if err != nil {
				t.Fatal(err)
			}
			defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			var matched [][]string
			for _, def := range defs {
				matched = append(matched, tt.expr.FindAllStringSubmatch(def, -1)...)
			}
			if len(matched) != 1 {
				t.Fatalf("%s: %d CHECK conditions match %s, want 1; constraints: %q", tt.table, len(matched), tt.expr, defs)
			}
			var got []string
			for _, m := range word.FindAllStringSubmatch(matched[0][1], -1) {
				got = append(got, m[1])
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("%s allows %q, Go has %q", tt.table, got, tt.want)
			}
		})
	}
}

// claimed is the set JobStatus.Claimed selects.
func claimed() []status.JobStatus {
	var out []status.JobStatus
	for _, s := range status.AllJobs() {
		if s.Claimed() {
			out = append(out, s)
		}
	}
	return out
}

// The methods and the sets say the same, and the unfinished and terminal sets split the whole.
func TestSetsAgreeWithMethods(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                     string
		all                      []string
		unfinished, terminal     []string
		isUnfinished, isTerminal func(string) bool
	}{
		{
			"jobs", strs(status.AllJobs()), strs(status.UnfinishedJobs()), strs(status.TerminalJobs()),
			func(s string) bool { return status.JobStatus(s).Unfinished() },
			func(s string) bool { return status.JobStatus(s).Terminal() },
		},
		{
			"evaluations", strs(status.AllEvals()), strs(status.UnfinishedEvals()), strs(status.TerminalEvals()),
			func(s string) bool { return status.EvalStatus(s).Unfinished() },
			func(s string) bool { return status.EvalStatus(s).Terminal() },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if union := slices.Sorted(slices.Values(append(slices.Clone(tt.unfinished), tt.terminal...))); !slices.Equal(union, tt.all) {
				t.Errorf("unfinished %q + terminal %q = %q, want all %q", tt.unfinished, tt.terminal, union, tt.all)
			}
			for _, s := range tt.all {
				u, f := tt.isUnfinished(s), tt.isTerminal(s)
				if u == f {
					t.Errorf("%s: Unfinished() = %v, Terminal() = %v: want exactly one", s, u, f)
				}
				if u != slices.Contains(tt.unfinished, s) || f != slices.Contains(tt.terminal, s) {
					t.Errorf("%s: Unfinished() = %v, Terminal() = %v, but the sets say otherwise", s, u, f)
				}
			}
		})
	}
}

// A status binds as a query argument, alone or as a set, and scans back into its type.
func TestPgxRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := dbtest.NewPool(t)

	var got status.JobStatus
	if err := pool.QueryRow(ctx, `SELECT $1::text`, status.JobDepFailed).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != status.JobDepFailed {
		t.Errorf("scanned %q, want %q", got, status.JobDepFailed)
	}
	var set []status.JobStatus
	if err := pool.QueryRow(ctx, `SELECT $1::text[]`, status.UnfinishedJobs()).Scan(&set); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(set, status.UnfinishedJobs()) {
		t.Errorf("scanned %q, want %q", set, status.UnfinishedJobs())
	}
}
