package cli

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// `eval show --diff` prints what changed against the evaluation before, as a table and as
// JSON.
func TestEvalShowDiff(t *testing.T) {
	url := dbtest.NewDB(t)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	project := queuetest.NewProject(t, pool, "shown", 100)
	var evals []int64
	for i, outcomes := range []map[string]string{
		{"a": "succeeded", "b": "failed", "gone": "succeeded"},
		{"a": "failed", "b": "succeeded", "new": "failed"},
	} {
		e := queuetest.QueryInt(t, pool, `INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status)
VALUES ($1, 'x', $2, 'main', 'succeeded') RETURNING id`, project, strings.Repeat(fmt.Sprint(i+1), 40))
		evals = append(evals, e)
		for attr, st := range outcomes {
			drv := fmt.Sprintf("/nix/store/%032d-%s.drv", e*10+int64(len(attr)), attr)
			queuetest.Exec(t, pool, `INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, substr($1, 12, 32), $2, 'x86_64-linux', 'sha256:0', 0)`, drv, attr)
			queuetest.Exec(t, pool, `INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3)`, e, attr, drv)
			queuetest.Exec(t, pool, `INSERT INTO build_jobs (drv_path, project_id, system, status, claimed_by)
VALUES ($1, $2, 'x86_64-linux', $3, 'b1')`, drv, project, st)
		}
	}
	id := fmt.Sprint(evals[1])
	out, err := runCLI(t, "eval", "show", "--diff", id, "--database-url", url)
	if err != nil {
		t.Fatalf("eval show --diff: %v\n%s", err, out)
	}
	for _, want := range []string{
		fmt.Sprintf("against evaluation %d: 1 newly failing, 1 fixed, 1 new and failing, 1 removed", evals[0]),
		"newly failing  a\n", "fixed          b\n", "new, failing   new\n", "removed        gone\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("eval show --diff lacks %q:\n%s", want, out)
		}
	}
	out, err = runCLI(t, "eval", "show", "--diff", "--json", id, "--database-url", url)
	if err != nil {
		t.Fatalf("eval show --diff --json: %v\n%s", err, out)
	}
	var d evaluation.Diff
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	want := evaluation.Diff{Against: evals[0], NewlyFailing: []string{"a"}, NewlyFixed: []string{"b"},
		Added: []string{"new"}, AddedFailing: []string{"new"}, Removed: []string{"gone"}}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("--json: %+v, want %+v", d, want)
	}
}
