package metrics_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/metrics"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// values gathers reg into "name{k=v,...}" -> value (labels sorted by name, as gathered).
func values(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func execSQL(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func drv(t *testing.T, pool *pgxpool.Pool, n int, system string) string {
	t.Helper()
	hash := fmt.Sprintf("%032d", n)
	path := "/nix/store/" + hash + "-d.drv"
	execSQL(t, pool, `INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, 'd', $3, 'sha256:0', 0)`, path, hash, system)
	return path
}

func TestCollectorReportsTheDatabase(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	execSQL(t, pool, `INSERT INTO repositories (forge, owner, name, full_name, clone_url) VALUES ('git', 'o', 'r', 'o/r', 'https://x/o/r.git')`)
	execSQL(t, pool, `INSERT INTO projects (repo_id, name, consumed_seconds) SELECT id, 'proj', 42.5 FROM repositories`)
	for i, st := range []status.EvalStatus{status.EvalQueued, status.EvalRunning, status.EvalRunning, status.EvalSucceeded} {
		execSQL(t, pool, `INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by)
SELECT id, 'git+https://x/o/r.git', $1, 'main', $2, CASE WHEN $2 = 'running' THEN 'n1' END FROM projects`, fmt.Sprint(i), st)
	}
	execSQL(t, pool, `INSERT INTO nodes (id, roles, endpoint, max_jobs, current_jobs, status, incarnation)
VALUES ('b1', '{builder}', 'http://b1', 4, 3, 'active', gen_random_uuid()),
       ('b2', '{builder}', 'http://b2', 2, 0, 'dead', gen_random_uuid()),
       ('f1', '{frontend}', 'http://f1', 1, 0, 'active', gen_random_uuid())`)

	// x86_64: a ready job (created an hour ago), a job blocked on it, one building and one
	// succeeded (never counted); aarch64: one uploading.
	a, b := drv(t, pool, 1, "x86_64-linux"), drv(t, pool, 2, "x86_64-linux")
	execSQL(t, pool, `INSERT INTO derivation_inputs (referrer, input_drv, outputs) VALUES ($1, $2, '{out}')`, b, a)
	execSQL(t, pool, `INSERT INTO build_jobs (drv_path, system, created_at) VALUES ($1, 'x86_64-linux', now() - interval '1 hour')`, a)
	execSQL(t, pool, `INSERT INTO build_jobs (drv_path, system) VALUES ($1, 'x86_64-linux')`, b)
	execSQL(t, pool, `INSERT INTO build_jobs (drv_path, system, status, claimed_by) VALUES ($1, 'x86_64-linux', 'building', 'b1')`, drv(t, pool, 3, "x86_64-linux"))
	execSQL(t, pool, `INSERT INTO build_jobs (drv_path, system, status) VALUES ($1, 'x86_64-linux', 'succeeded')`, drv(t, pool, 4, "x86_64-linux"))
	execSQL(t, pool, `INSERT INTO build_jobs (drv_path, system, status, claimed_by) VALUES ($1, 'aarch64-linux', 'uploading', 'b1')`, drv(t, pool, 5, "aarch64-linux"))

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(pool))
	got := values(t, reg)
	want := map[string]float64{
		"harmonia_ci_build_jobs{status=pending,system=x86_64-linux}":    2,
		"harmonia_ci_build_jobs{status=building,system=x86_64-linux}":   1,
		"harmonia_ci_build_jobs{status=uploading,system=x86_64-linux}":  0,
		"harmonia_ci_build_jobs{status=pending,system=aarch64-linux}":   0,
		"harmonia_ci_build_jobs{status=building,system=aarch64-linux}":  0,
		"harmonia_ci_build_jobs{status=uploading,system=aarch64-linux}": 1,
		"harmonia_ci_build_jobs_ready":                                  1,
		"harmonia_ci_build_jobs_blocked":                                1,
		"harmonia_ci_node_jobs{node=b1}":                                3,
		"harmonia_ci_node_max_jobs{node=b1}":                            4,
		"harmonia_ci_project_consumed_seconds{project=proj}":            42.5,
		"harmonia_ci_evaluations{status=queued}":                        1,
		"harmonia_ci_evaluations{status=running}":                       2,
		"harmonia_ci_scrape_errors_total":                               0,
	}
	age := got["harmonia_ci_oldest_ready_job_age_seconds"]
	delete(got, "harmonia_ci_oldest_ready_job_age_seconds")
	if age < 3600 || age > 3600+300 {
		t.Errorf("harmonia_ci_oldest_ready_job_age_seconds = %v, want about 3600", age)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series %s = %v", k, got[k])
		}
	}
}

func TestCollectorEmptyDatabase(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(pool))
	got := values(t, reg)
	want := map[string]float64{
		"harmonia_ci_build_jobs_ready":             0,
		"harmonia_ci_build_jobs_blocked":           0,
		"harmonia_ci_oldest_ready_job_age_seconds": 0,
		"harmonia_ci_evaluations{status=queued}":   0,
		"harmonia_ci_evaluations{status=running}":  0,
		"harmonia_ci_scrape_errors_total":          0,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("empty database:\n got %v\nwant %v", got, want)
	}
}

func TestCollectorErrorReportsNoStaleValues(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(pool))
	if got := values(t, reg); got["harmonia_ci_build_jobs_ready"] != 0 || len(got) < 5 {
		t.Fatalf("first scrape: %v", got)
	}
	pool.Close()
	start := time.Now()
	got := values(t, reg)
	if time.Since(start) > metrics.ScrapeTimeout+time.Second {
		t.Errorf("a failing scrape took %v", time.Since(start))
	}
	want := map[string]float64{"harmonia_ci_scrape_errors_total": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("scrape with the database closed:\n got %v\nwant %v", got, want)
	}
}

// /metrics answers anyone: a private or disabled project's name never appears in it, only its
// id; a public, enabled one keeps its name.
func TestCollectorHidesPrivateProjectNames(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	var ids [3]int64
	for i, p := range []struct {
		name             string
		private, enabled bool
	}{{"open", false, true}, {"secret-project", true, true}, {"switched-off", false, false}} {
		execSQL(t, pool, `INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private)
VALUES ('gitea', 'o', $1, 'o/' || $1, 'https://x/o/' || $1 || '.git', $2)`, p.name, p.private)
		if err := pool.QueryRow(t.Context(), `INSERT INTO projects (repo_id, name, enabled, consumed_seconds)
SELECT id, $1, $2, 7 FROM repositories WHERE name = $1 RETURNING id`, p.name, p.enabled).Scan(&ids[i]); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(pool))
	got := values(t, reg)
	for _, series := range []string{
		"harmonia_ci_project_consumed_seconds{project=open}",
		fmt.Sprintf("harmonia_ci_project_consumed_seconds{project=#%d}", ids[1]),
		fmt.Sprintf("harmonia_ci_project_consumed_seconds{project=#%d}", ids[2]),
	} {
		if got[series] != 7 {
			t.Errorf("%s = %v, want 7", series, got[series])
		}
	}
	for series := range got {
		if strings.Contains(series, "secret-project") || strings.Contains(series, "switched-off") {
			t.Errorf("a private or disabled project's name in /metrics: %s", series)
		}
	}
}
