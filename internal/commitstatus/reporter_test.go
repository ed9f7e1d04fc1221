package commitstatus

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/metricstest"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

const (
	testCommit = "0123456789abcdef0123456789abcdef01234567"
	// wait bounds every wait for something the reporter does in the background.
	wait = 10 * time.Second
)

// testRepo is the forge repository of the project "proj".
var testRepo = forge.Repo{Owner: "o", Name: "r"}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// fixture is a private database with the project "proj" on the forge "gitea" (repository o/r)
// and a fake of that forge.
type fixture struct {
	t       *testing.T
	ctx     context.Context
	pool    *pgxpool.Pool
	forge   *fakeForge
	project int64
	drvs    int
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	fx := &fixture{t: t, ctx: t.Context(), pool: dbtest.NewPool(t), forge: newFakeForge("gitea")}
	fx.project = fx.newProject("proj", "gitea", "o/r")
	return fx
}

func (fx *fixture) exec(sql string, args ...any) {
	fx.t.Helper()
	if _, err := fx.pool.Exec(fx.ctx, sql, args...); err != nil {
		fx.t.Fatalf("%s: %v", sql, err)
	}
}

func (fx *fixture) newProject(name, forgeName, fullName string) int64 {
	fx.t.Helper()
	var repo, id int64
	owner, repoName, _ := strings.Cut(fullName, "/")
	err := fx.pool.QueryRow(fx.ctx, `
INSERT INTO repositories (forge, owner, name, full_name, clone_url) VALUES ($1, $2, $3, $4, $5)
RETURNING id`, forgeName, owner, repoName, fullName, "https://x/"+fullName+".git").Scan(&repo)
	if err != nil {
		fx.t.Fatalf("insert repository: %v", err)
	}
	if err := fx.pool.QueryRow(fx.ctx, `INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`,
		repo, name).Scan(&id); err != nil {
		fx.t.Fatalf("insert project: %v", err)
	}
	return id
}

// newEval inserts a queued evaluation of testCommit.
func (fx *fixture) newEval(project int64) int64 {
	fx.t.Helper()
	return fx.newEvalOf(project, testCommit)
}

func (fx *fixture) newEvalOf(project int64, commit string) int64 {
	fx.t.Helper()
	var id int64
	if err := fx.pool.QueryRow(fx.ctx, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch) VALUES ($1, 'git+https://x/o/r.git', $2, 'main')
RETURNING id`, project, commit).Scan(&id); err != nil {
		fx.t.Fatalf("insert evaluation: %v", err)
	}
	return id
}

// drv inserts a derivation.
func (fx *fixture) drv() string {
	fx.t.Helper()
	fx.drvs++
	hash := fmt.Sprintf("%032d", fx.drvs)
	path := "/nix/store/" + hash + "-pkg" + strconv.Itoa(fx.drvs) + ".drv"
	fx.exec(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, $3, 'x86_64-linux', 'sha256:0', 0)`, path, hash, "pkg"+strconv.Itoa(fx.drvs))
	return path
}

// attr inserts an attribute of evaluation id: drv "" is an attribute that failed to evaluate.
func (fx *fixture) attr(id int64, name, drv string) {
	fx.t.Helper()
	if drv == "" {
		fx.exec(`INSERT INTO eval_attrs (eval_id, attr, error) VALUES ($1, $2, 'error: boom')`, id, name)
		return
	}
	fx.exec(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3)`, id, name, drv)
}

// job inserts a pending build job for drv and returns its id.
func (fx *fixture) job(drv string) int64 {
	fx.t.Helper()
	var id int64
	if err := fx.pool.QueryRow(fx.ctx, `INSERT INTO build_jobs (drv_path, project_id, system)
VALUES ($1, $2, 'x86_64-linux') RETURNING id`, drv, fx.project).Scan(&id); err != nil {
		fx.t.Fatalf("insert build job: %v", err)
	}
	return id
}

// addBuilds gives evaluation id n attributes, each with a derivation and a pending job.
func (fx *fixture) addBuilds(id int64, n int) []string {
	fx.t.Helper()
	var drvs []string
	for i := range n {
		d := fx.drv()
		fx.attr(id, "packages.x86_64-linux.p"+strconv.Itoa(i), d)
		fx.job(d)
		drvs = append(drvs, d)
	}
	return drvs
}

func (fx *fixture) setEval(id int64, st status.EvalStatus, errText string) {
	fx.t.Helper()
	fx.exec(`UPDATE evaluations SET status = $2, error = NULLIF($3, '') WHERE id = $1`, id, st, errText)
}

func (fx *fixture) setJob(drv string, st status.JobStatus) {
	fx.t.Helper()
	fx.exec(`UPDATE build_jobs SET status = $2,
    claimed_by = CASE WHEN $2 IN ('building', 'uploading') THEN 'builder-1' ELSE claimed_by END
WHERE drv_path = $1`, drv, st)
}

// reporter builds a reporter of node on the fixture's forge. The defaults keep the background
// timers out of the way; tests drive Transition and Retry themselves.
func (fx *fixture) reporter(node string, mod ...func(*Config)) *Reporter {
	cfg := Config{
		NodeID:            node,
		Forges:            forge.Set{"gitea": fx.forge},
		Links:             Links{Base: testBase + "/"},
		Lease:             time.Minute,
		RetryInterval:     time.Hour,
		ReconcileInterval: time.Hour,
		CallTimeout:       time.Minute,
		Logger:            testLogger(fx.t),
	}
	for _, m := range mod {
		m(&cfg)
	}
	return New(cfg, fx.pool)
}

func (fx *fixture) transition(r *Reporter, id int64) {
	fx.t.Helper()
	if err := r.Transition(fx.ctx, id); err != nil {
		fx.t.Fatalf("Transition(%d) on %s: %v", id, r.cfg.NodeID, err)
	}
}

func (fx *fixture) retry(r *Reporter) {
	fx.t.Helper()
	if err := r.Retry(fx.ctx); err != nil {
		fx.t.Fatalf("Retry on %s: %v", r.cfg.NodeID, err)
	}
}

// row is an evaluation's reporting columns.
type row struct {
	LastStatus, ReportedStatus, Owner *string
	Attempts                          int
	Final                             bool
	// NextAttemptIn is report_next_attempt - now(), nil if NULL.
	NextAttemptIn *time.Duration
}

func (fx *fixture) row(id int64) row {
	fx.t.Helper()
	var r row
	var next *float64
	err := fx.pool.QueryRow(fx.ctx, `
SELECT last_status, reported_status, report_owner, report_attempts, report_final,
       EXTRACT(EPOCH FROM report_next_attempt - now())::float8
FROM evaluations WHERE id = $1`, id).Scan(&r.LastStatus, &r.ReportedStatus, &r.Owner, &r.Attempts, &r.Final, &next)
	if err != nil {
		fx.t.Fatalf("read evaluation %d: %v", id, err)
	}
	if next != nil {
		d := time.Duration(*next * float64(time.Second))
		r.NextAttemptIn = &d
	}
	return r
}

// settled checks that the forge has been told evaluation id's report and nobody holds its
// delivery.
func (fx *fixture) settled(id int64) row {
	fx.t.Helper()
	r := fx.row(id)
	if r.LastStatus == nil || r.ReportedStatus == nil || *r.LastStatus != *r.ReportedStatus {
		fx.t.Errorf("evaluation %d: reported_status %v, want last_status %v", id, deref(r.ReportedStatus), deref(r.LastStatus))
	}
	if r.Owner != nil || r.Attempts != 0 || r.NextAttemptIn != nil {
		fx.t.Errorf("evaluation %d: owner %v, attempts %d, next attempt in %v: want a released delivery",
			id, deref(r.Owner), r.Attempts, r.NextAttemptIn)
	}
	return r
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// released reports whether the forge has been told evaluation id's report and nobody holds its
// delivery.
func (fx *fixture) released(id int64) bool {
	fx.t.Helper()
	r := fx.row(id)
	return r.LastStatus != nil && r.ReportedStatus != nil && *r.LastStatus == *r.ReportedStatus && r.Owner == nil
}

// backdate makes a failed delivery due, or a held lease expired.
func (fx *fixture) backdate(id int64, column string) {
	fx.t.Helper()
	fx.exec(`UPDATE evaluations SET `+column+` = now() - interval '1s' WHERE id = $1`, id)
}

func evalStatus(id int64, state forge.State, desc string) forge.Status {
	return forge.Status{Context: ContextEval, State: state, Description: desc,
		TargetURL: testBase + "/ci/proj/eval/" + strconv.FormatInt(id, 10)}
}

func buildStatus(id int64, state forge.State, desc string) forge.Status {
	return forge.Status{Context: ContextBuild, State: state, Description: desc,
		TargetURL: testBase + "/ci/proj/eval/" + strconv.FormatInt(id, 10)}
}

// sentSince returns the statuses the forge accepted from index from on, checking that each
// went to the project's repository and commit.
func (fx *fixture) sentSince(from int) []forge.Status {
	fx.t.Helper()
	all := fx.forge.statuses()
	var out []forge.Status
	for _, s := range all[from:] {
		if s.Repo != testRepo || s.Commit != testCommit {
			fx.t.Errorf("status %+v sent to %s@%s, want %s@%s", s.Status, s.Repo.FullName(), s.Commit,
				testRepo.FullName(), testCommit)
		}
		out = append(out, s.Status)
	}
	return out
}

func (fx *fixture) wantSent(from int, want ...forge.Status) {
	fx.t.Helper()
	if got := fx.sentSince(from); !slices.Equal(got, want) {
		fx.t.Errorf("forge received\n%s\nwant\n%s", fmtStatuses(got), fmtStatuses(want))
	}
}

func fmtStatuses(ss []forge.Status) string {
	if len(ss) == 0 {
		return "  (nothing)"
	}
	var s string
	for _, st := range ss {
		s += fmt.Sprintf("  %s %s %q %s\n", st.Context, st.State, st.Description, st.TargetURL)
	}
	return s
}

// noDuplicates checks that no status reached the forge twice.
func noDuplicates(t *testing.T, sent []forge.Status) {
	t.Helper()
	seen := map[forge.Status]int{}
	for _, s := range sent {
		seen[s]++
	}
	for s, n := range seen {
		if n > 1 {
			t.Errorf("%s %s %q reached the forge %d times", s.Context, s.State, s.Description, n)
		}
	}
}

// inOrder checks that, per context, what the forge received follows the order of progress:
// nothing stale after something newer.
func inOrder(t *testing.T, sent, progress []forge.Status) {
	t.Helper()
	last := map[string]int{}
	for _, s := range sent {
		i := slices.Index(progress, s)
		if i < 0 {
			t.Errorf("unexpected status %s %s %q", s.Context, s.State, s.Description)
			continue
		}
		if prev, ok := last[s.Context]; ok && i <= prev {
			t.Errorf("%s %s %q after %q: stale or repeated", s.Context, s.State, s.Description, progress[prev].Description)
		}
		last[s.Context] = i
	}
}

// The statuses of one evaluation as it is queued, evaluated and built, each change reported
// once and nothing reported when nothing changed.
func TestTransitionSequence(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	r := fx.reporter("frontend-1")
	id := fx.newEval(fx.project)
	var drvs []string
	steps := []struct {
		name   string
		change func()
		want   []forge.Status
	}{
		{"queued", func() {}, []forge.Status{evalStatus(id, forge.StatePending, "queued")}},
		{"running", func() { fx.setEval(id, status.EvalRunning, "") },
			[]forge.Status{evalStatus(id, forge.StatePending, "evaluating")}},
		{"evaluated, builds pending", func() {
			drvs = fx.addBuilds(id, 3)
			fx.setEval(id, status.EvalSucceeded, "")
		}, []forge.Status{
			evalStatus(id, forge.StateSuccess, "evaluated 3 attributes"),
			buildStatus(id, forge.StatePending, "0/3 builds complete"),
		}},
		{"a build starts: nothing to report", func() { fx.setJob(drvs[0], status.JobBuilding) }, nil},
		{"first build done", func() { fx.setJob(drvs[0], status.JobSucceeded) },
			[]forge.Status{buildStatus(id, forge.StatePending, "1/3 builds complete")}},
		{"second build done", func() { fx.setJob(drvs[1], status.JobSucceeded) },
			[]forge.Status{buildStatus(id, forge.StatePending, "2/3 builds complete")}},
		{"last build done", func() { fx.setJob(drvs[2], status.JobSucceeded) },
			[]forge.Status{buildStatus(id, forge.StateSuccess, "3/3 builds complete")}},
	}
	for i, st := range steps {
		from := len(fx.forge.statuses())
		st.change()
		fx.transition(r, id)
		fx.transition(r, id) // nothing changed: nothing more
		fx.wantSent(from, st.want...)
		if t.Failed() {
			t.Fatalf("step %q", st.name)
		}
		got := fx.settled(id)
		if final := i == len(steps)-1; got.Final != final {
			t.Errorf("step %q: report_final = %v, want %v", st.name, got.Final, final)
		}
	}
	if _, latest := fx.forge.calls(); latest != 0 {
		t.Errorf("%d LatestStatus calls, want none: no delivery was recovering", latest)
	}
}

// Once its builds are done, an evaluation's nix-build status says what changed against the
// evaluation of its branch before it.
func TestTransitionSaysWhatChanged(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	r := fx.reporter("frontend-1")
	before := fx.newEvalOf(fx.project, strings.Repeat("1", 40))
	old := fx.addBuilds(before, 2) // p0 and p1
	fx.setJob(old[0], status.JobSucceeded)
	fx.setJob(old[1], status.JobFailed)
	fx.setEval(before, status.EvalSucceeded, "")

	id := fx.newEval(fx.project)
	now := fx.addBuilds(id, 2) // p0 breaks, p1 is fixed
	fx.setEval(id, status.EvalSucceeded, "")
	from := len(fx.forge.statuses())
	fx.setJob(now[0], status.JobFailed)
	fx.setJob(now[1], status.JobSucceeded)
	fx.transition(r, id)
	sent := fx.sentSince(from)
	if len(sent) == 0 || sent[len(sent)-1].Description != "1/2 builds failed (1 newly failing, 1 fixed)" {
		t.Errorf("statuses sent: %s; want the last to say 1 newly failing, 1 fixed", fmtStatuses(sent))
	}
}

// The aggregate over an evaluation's attributes and their jobs, as Transition stores it.
func TestTransitionAggregate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// setup gives evaluation id its attributes and jobs and returns the first failed job
		// the report should link (0: the evaluation page).
		setup     func(fx *fixture, id int64) int64
		wantEval  string
		wantState forge.State
		wantBuild string
	}{
		{
			name: "a cached derivation (no job) counts as built",
			setup: func(fx *fixture, id int64) int64 {
				fx.attr(id, "a", fx.drv())
				fx.addBuilds(id, 1)
				return 0
			},
			wantEval: "evaluated 2 attributes", wantState: forge.StatePending, wantBuild: "1/2 builds complete",
		},
		{
			name: "attributes sharing a derivation count it once",
			setup: func(fx *fixture, id int64) int64 {
				d := fx.drv()
				fx.job(d)
				fx.attr(id, "a", d)
				fx.attr(id, "b", d)
				fx.setJob(d, status.JobSucceeded)
				return 0
			},
			wantEval: "evaluated 2 attributes", wantState: forge.StateSuccess, wantBuild: "1/1 builds complete",
		},
		{
			name: "building and uploading are pending",
			setup: func(fx *fixture, id int64) int64 {
				drvs := fx.addBuilds(id, 3)
				fx.setJob(drvs[0], status.JobBuilding)
				fx.setJob(drvs[1], status.JobUploading)
				fx.setJob(drvs[2], status.JobSucceeded)
				return 0
			},
			wantEval: "evaluated 3 attributes", wantState: forge.StatePending, wantBuild: "1/3 builds complete",
		},
		{
			name: "an attribute that failed to evaluate",
			setup: func(fx *fixture, id int64) int64 {
				fx.attr(id, "broken", "")
				fx.setJob(fx.addBuilds(id, 1)[0], status.JobSucceeded)
				return 0
			},
			wantEval: "1 of 2 attributes failed to evaluate", wantState: forge.StateSuccess, wantBuild: "1/1 builds complete",
		},
		{
			name: "a failed build is linked before an earlier dependency failure",
			setup: func(fx *fixture, id int64) int64 {
				drvs := fx.addBuilds(id, 3)
				fx.setJob(drvs[0], status.JobDepFailed)
				fx.setJob(drvs[1], status.JobFailed)
				fx.setJob(drvs[2], status.JobSucceeded)
				var job int64
				if err := fx.pool.QueryRow(fx.ctx, `SELECT id FROM build_jobs WHERE drv_path = $1`, drvs[1]).Scan(&job); err != nil {
					fx.t.Fatal(err)
				}
				return job
			},
			wantEval: "evaluated 3 attributes", wantState: forge.StateFailure, wantBuild: "2/3 builds failed",
		},
		{
			name: "a dependency failure alone is linked",
			setup: func(fx *fixture, id int64) int64 {
				drvs := fx.addBuilds(id, 2)
				fx.setJob(drvs[1], status.JobDepFailed)
				fx.setJob(drvs[0], status.JobSucceeded)
				var job int64
				if err := fx.pool.QueryRow(fx.ctx, `SELECT id FROM build_jobs WHERE drv_path = $1`, drvs[1]).Scan(&job); err != nil {
					fx.t.Fatal(err)
				}
				return job
			},
			wantEval: "evaluated 2 attributes", wantState: forge.StateFailure, wantBuild: "1/2 builds failed",
		},
		{
			name: "cancelled builds",
			setup: func(fx *fixture, id int64) int64 {
				drvs := fx.addBuilds(id, 2)
				fx.setJob(drvs[0], status.JobCancelled)
				fx.setJob(drvs[1], status.JobSucceeded)
				return 0
			},
			wantEval: "evaluated 2 attributes", wantState: forge.StateError, wantBuild: "1/2 builds cancelled",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newFixture(t)
			id := fx.newEval(fx.project)
			link := tt.setup(fx, id)
			fx.setEval(id, status.EvalSucceeded, "")
			fx.transition(fx.reporter("frontend-1"), id)
			got := decodeReport(fx.settled(id).LastStatus)
			wantURL := testBase + "/ci/proj/eval/" + strconv.FormatInt(id, 10)
			if link != 0 {
				wantURL = testBase + "/ci/proj/build/" + strconv.FormatInt(link, 10)
			}
			want := Line{tt.wantState, tt.wantBuild, wantURL}
			if got.Eval.Description != tt.wantEval || got.Build != want {
				t.Errorf("report %+v\nwant eval %q, build %+v", got, tt.wantEval, want)
			}
		})
	}
}

// progression drives an evaluation from queued to all of its n builds done, one change per
// step, and lists the statuses that state passes through in order.
func progression(fx *fixture, id int64, n int) (steps []func(), statuses []forge.Status) {
	steps = append(steps,
		func() {},
		func() { fx.setEval(id, status.EvalRunning, "") },
	)
	statuses = append(statuses,
		evalStatus(id, forge.StatePending, "queued"),
		evalStatus(id, forge.StatePending, "evaluating"),
		evalStatus(id, forge.StateSuccess, fmt.Sprintf("evaluated %d attributes", n)),
		buildStatus(id, forge.StatePending, fmt.Sprintf("0/%d builds complete", n)),
	)
	var drvs []string
	steps = append(steps, func() {
		drvs = fx.addBuilds(id, n)
		fx.setEval(id, status.EvalSucceeded, "")
	})
	for i := range n {
		steps = append(steps, func() { fx.setJob(drvs[i], status.JobSucceeded) })
		state := forge.StatePending
		if i == n-1 {
			state = forge.StateSuccess
		}
		statuses = append(statuses, buildStatus(id, state, fmt.Sprintf("%d/%d builds complete", i+1, n)))
	}
	return steps, statuses
}

// Three frontends react to every change of one evaluation at once: each change reaches the
// forge once, in order, and the last one is the final state.
func TestTransitionDedupAcrossFrontends(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// stepwise waits for each change to reach the forge before making the next; otherwise
		// the changes race the frontends, which may skip intermediate states.
		stepwise bool
		builds   int
	}{
		{"stepwise", true, 5},
		{"racing", false, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newFixture(t)
			id := fx.newEval(fx.project)
			steps, progress := progression(fx, id, tt.builds)

			ctx, stop := context.WithCancel(fx.ctx)
			var wg sync.WaitGroup
			for _, node := range []string{"frontend-a", "frontend-b", "frontend-c"} {
				r := fx.reporter(node)
				wg.Go(func() {
					for ctx.Err() == nil {
						if err := r.Transition(ctx, id); err != nil && ctx.Err() == nil {
							t.Errorf("Transition on %s: %v", node, err)
						}
						if err := r.Retry(ctx); err != nil && ctx.Err() == nil {
							t.Errorf("Retry on %s: %v", node, err)
						}
					}
				})
			}
			for i, step := range steps {
				step()
				if tt.stepwise {
					last := progress[min(i, 2)]
					if i >= 2 {
						last = progress[i+1]
					}
					waittest.For(t, wait, func() bool { return fx.forge.has(last) }, "%s %q on the forge", last.Context, last.Description)
				}
			}
			final := progress[len(progress)-1]
			waittest.For(t, wait, func() bool { return fx.forge.has(final) }, "the final status on the forge")
			// Stopped mid-delivery, a frontend would keep its lease until it runs out.
			waittest.For(t, wait, func() bool { return fx.released(id) }, "the delivery recorded and released")
			stop()
			wg.Wait()

			sent := fx.sentSince(0)
			noDuplicates(t, sent)
			inOrder(t, sent, progress)
			if tt.stepwise && !slices.Equal(sent, progress) {
				t.Errorf("forge received\n%s\nwant\n%s", fmtStatuses(sent), fmtStatuses(progress))
			}
			if !fx.forge.has(progress[2]) {
				t.Errorf("the forge does not show %q", progress[2].Description)
			}
			if r := fx.settled(id); !r.Final {
				t.Error("report_final is false after the last build")
			}
		})
	}
}

// A delivery that fails is released with a backoff and delivered once, by any frontend, after
// it; a delivery whose second context fails does not send the first again.
func TestRetryFailedDelivery(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// pass calls succeed before the failing one
		pass     int
		evaluate bool
		// wantFirst is what reaches the forge before the retry, wantRetry what the retry sends
		wantFirst, wantRetry func(id int64) []forge.Status
	}{
		{
			name: "first context fails",
			wantFirst: func(int64) []forge.Status {
				return nil
			},
			wantRetry: func(id int64) []forge.Status {
				return []forge.Status{evalStatus(id, forge.StatePending, "queued")}
			},
		},
		{
			name: "second context fails", pass: 1, evaluate: true,
			wantFirst: func(id int64) []forge.Status {
				return []forge.Status{evalStatus(id, forge.StateSuccess, "evaluated 2 attributes")}
			},
			wantRetry: func(id int64) []forge.Status {
				return []forge.Status{buildStatus(id, forge.StatePending, "0/2 builds complete")}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newFixture(t)
			// The backoff is RetryInterval, doubling with each failed attempt.
			retryEvery := func(c *Config) { c.RetryInterval = time.Minute }
			reg := prometheus.NewRegistry()
			a := fx.reporter("frontend-a", retryEvery, func(c *Config) { c.Registerer = reg })
			b := fx.reporter("frontend-b", retryEvery)
			id := fx.newEval(fx.project)
			if tt.evaluate {
				fx.addBuilds(id, 2)
				fx.setEval(id, status.EvalSucceeded, "")
			}

			fx.forge.failAfter(tt.pass, 1)
			fx.transition(a, id)
			fx.wantSent(0, tt.wantFirst(id)...)
			if ok, failed, timed := statusCalls(t, reg, fx.forge.Name()); ok != float64(tt.pass) || failed != 1 || timed != uint64(tt.pass+1) {
				t.Errorf("calls ok %v, error %v, timed %d; want %d, 1, %d", ok, failed, timed, tt.pass, tt.pass+1)
			}
			r := fx.row(id)
			if r.Owner != nil || r.Attempts != 1 || r.NextAttemptIn == nil || *r.NextAttemptIn < 50*time.Second ||
				*r.NextAttemptIn > time.Minute {
				t.Fatalf("after the failure: owner %v, attempts %d, next attempt in %v; want released, 1 attempt, "+
					"retried after RetryInterval (1m)", deref(r.Owner), r.Attempts, r.NextAttemptIn)
			}

			// Not before the backoff, and no new transition: nothing changed.
			fx.retry(a)
			fx.retry(b)
			fx.transition(b, id)
			if calls, _ := fx.forge.calls(); calls != tt.pass+1 {
				t.Fatalf("%d ReportStatus calls during the backoff, want %d", calls, tt.pass+1)
			}

			// It fails again: the backoff doubles.
			fx.backdate(id, "report_next_attempt")
			fx.forge.fail(1)
			fx.retry(b)
			if r := fx.row(id); r.Attempts != 2 || r.NextAttemptIn == nil || *r.NextAttemptIn < 110*time.Second ||
				*r.NextAttemptIn > 2*time.Minute {
				t.Fatalf("after the second failure: attempts %d, next attempt in %v; want 2, in 2m", r.Attempts, r.NextAttemptIn)
			}

			fx.backdate(id, "report_next_attempt")
			fx.retry(b)
			fx.retry(a)
			fx.retry(b)
			fx.wantSent(0, append(tt.wantFirst(id), tt.wantRetry(id)...)...)
			fx.settled(id)
			if _, latest := fx.forge.calls(); latest == 0 {
				t.Error("the retry did not ask the forge what it shows first")
			}
		})
	}
}

// A frontend that won a transition stalls in the forge call after the forge got the status;
// once its lease ran out another frontend takes over, sees the status on the forge and does
// not send it again. The stalled frontend, whether it dies or wakes up, sends nothing more.
func TestTakeOverStalledDelivery(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// byTransition: the taker is a frontend reacting to a newer change; otherwise its
		// retry sweep.
		byTransition bool
		// wakes: the stalled call returns (a slow node); otherwise its context ends (it died).
		wakes bool
	}{
		{"retry takes over, stalled node dies", false, false},
		{"retry takes over, stalled node wakes", false, true},
		{"transition takes over, stalled node dies", true, false},
		{"transition takes over, stalled node wakes", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newFixture(t)
			a, b := fx.reporter("frontend-a"), fx.reporter("frontend-b")
			id := fx.newEval(fx.project)
			drvs := fx.addBuilds(id, 2)
			fx.setEval(id, status.EvalSucceeded, "")

			entered, release := fx.forge.block(true)
			actx, die := context.WithCancel(fx.ctx)
			done := make(chan error, 1)
			returned := make(chan struct{})
			go func() { defer close(returned); done <- a.Transition(actx, id) }()
			t.Cleanup(func() { release(); die(); <-returned })
			select {
			case <-entered:
			case <-time.After(wait):
				t.Fatal("the first delivery never reached the forge")
			}
			if r := fx.row(id); deref(r.Owner) != "frontend-a" {
				t.Fatalf("delivery held by %v, want frontend-a", deref(r.Owner))
			}

			// Within the lease nobody else delivers.
			fx.retry(b)
			if calls, _ := fx.forge.calls(); calls != 1 {
				t.Fatalf("%d ReportStatus calls while frontend-a holds the lease, want 1", calls)
			}

			fx.backdate(id, "report_lease_until")
			wantBuild := buildStatus(id, forge.StatePending, "0/2 builds complete")
			if tt.byTransition {
				fx.setJob(drvs[0], status.JobSucceeded)
				fx.transition(b, id)
				wantBuild = buildStatus(id, forge.StatePending, "1/2 builds complete")
			} else {
				fx.retry(b)
			}
			want := []forge.Status{evalStatus(id, forge.StateSuccess, "evaluated 2 attributes"), wantBuild}
			fx.wantSent(0, want...)
			if t.Failed() {
				t.FailNow()
			}

			if tt.wakes {
				release()
			} else {
				die()
			}
			select {
			case err := <-done:
				if err != nil && tt.wakes {
					t.Errorf("the stalled Transition: %v", err)
				}
			case <-time.After(wait):
				t.Fatal("the stalled Transition did not return")
			}
			fx.retry(a)
			fx.retry(b)
			fx.transition(b, id)
			fx.wantSent(0, want...)
			fx.settled(id)
		})
	}
}

// One frontend's retry sweep and its reaction to a notification run side by side: the retry's
// delivery is still in the forge call when the evaluation changes again. The change is
// delivered by the delivery already under way, and nothing is sent twice.
func TestSameFrontendRetryAndTransition(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	a := fx.reporter("frontend-a")
	id := fx.newEval(fx.project)
	drvs := fx.addBuilds(id, 2)
	fx.setEval(id, status.EvalSucceeded, "")

	fx.forge.fail(1)
	fx.transition(a, id)
	fx.backdate(id, "report_next_attempt")

	// The forge has not got the status yet when the retry's call stalls.
	entered, release := fx.forge.block(false)
	done := make(chan error, 1)
	returned := make(chan struct{})
	go func() { defer close(returned); done <- a.Retry(fx.ctx) }()
	t.Cleanup(func() { release(); <-returned })
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the retried delivery never reached the forge")
	}

	fx.setJob(drvs[0], status.JobSucceeded)
	fx.transition(a, id)
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Retry: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("Retry did not return")
	}
	fx.retry(a)
	fx.transition(a, id)

	sent := fx.sentSince(0)
	noDuplicates(t, sent)
	final := buildStatus(id, forge.StatePending, "1/2 builds complete")
	if !fx.forge.has(final) || !fx.forge.has(evalStatus(id, forge.StateSuccess, "evaluated 2 attributes")) {
		t.Errorf("forge received\n%s\nwant the evaluation's success and %q last", fmtStatuses(sent), final.Description)
	}
	fx.settled(id)
}

// A project whose repository is on no forge this node reports to is marked final and its
// statuses go nowhere.
func TestTransitionWithoutForge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, forge string
	}{
		{"plain git repository", "git"},
		{"forge not configured on this node", "github"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newFixture(t)
			r := fx.reporter("frontend-1")
			project := fx.newProject("other", tt.forge, "o/other")
			id := fx.newEval(project)
			fx.transition(r, id)
			fx.retry(r)
			if err := r.Reconcile(fx.ctx); err != nil {
				t.Fatalf("Reconcile: %v", err)
			}
			got := fx.row(id)
			if !got.Final || got.LastStatus != nil || got.Owner != nil {
				t.Errorf("report_final %v, last_status %v, owner %v: want final, nothing computed, no owner",
					got.Final, deref(got.LastStatus), deref(got.Owner))
			}
			if _, _, ok := r.next(); ok {
				t.Error("Reconcile scheduled the evaluation")
			}
			if calls, latest := fx.forge.calls(); calls+latest != 0 {
				t.Errorf("%d forge calls, want none", calls+latest)
			}
		})
	}
}

// Reconcile schedules the recent forge evaluations whose report is not final, and no other.
func TestReconcile(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	r := fx.reporter("frontend-1")
	open := fx.newEvalOf(fx.project, "c1")
	final := fx.newEvalOf(fx.project, "c2")
	old := fx.newEvalOf(fx.project, "c3")
	plain := fx.newEval(fx.newProject("plain", "git", "o/plain"))
	fx.exec(`UPDATE evaluations SET report_final = true WHERE id = $1`, final)
	fx.exec(`UPDATE evaluations SET created_at = now() - interval '8 days' WHERE id = $1`, old)

	if err := r.Reconcile(fx.ctx); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	var due []int64
	for {
		id, _, ok := r.next()
		if !ok {
			break
		}
		due = append(due, id)
	}
	if !slices.Equal(due, []int64{open}) {
		t.Errorf("due %v, want [%d] (not final %d, old %d, plain git %d)", due, open, final, old, plain)
	}
}

func TestTerminalDrvs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, payload string
		want          []string
	}{
		{"announcer form", `{"status":"succeeded","drv_paths":["/nix/store/a.drv","/nix/store/b.drv"]}`,
			[]string{"/nix/store/a.drv", "/nix/store/b.drv"}},
		{"single form", `{"drv_path":"/nix/store/a.drv","status":"dep-failed"}`, []string{"/nix/store/a.drv"}},
		{"failed", `{"drv_path":"/nix/store/a.drv","status":"failed"}`, []string{"/nix/store/a.drv"}},
		{"cancelled", `{"drv_path":"/nix/store/a.drv","status":"cancelled"}`, []string{"/nix/store/a.drv"}},
		{"back to pending (rebuild)", `{"drv_paths":["/nix/store/a.drv"],"status":"pending"}`, []string{"/nix/store/a.drv"}},
		{"building", `{"drv_path":"/nix/store/a.drv","status":"building"}`, nil},
		{"enqueue wake-up", `{"system":"x86_64-linux"}`, nil},
		{"malformed", `{"drv_path":`, nil},
		{"not json", `x86_64-linux`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := terminalDrvs(tt.payload); !slices.Equal(got, tt.want) {
				t.Errorf("terminalDrvs(%s) = %q, want %q", tt.payload, got, tt.want)
			}
		})
	}
}

// notifier starts a LISTEN session on the fixture's database, stopped in t.Cleanup.
func (fx *fixture) notifier() *notify.Notifier {
	fx.t.Helper()
	n := notify.New(notify.Config{}, fx.pool, testLogger(fx.t), clock.Real{})
	if err := n.Start(fx.ctx); err != nil {
		fx.t.Fatalf("notifier Start: %v", err)
	}
	fx.t.Cleanup(n.Stop)
	waittest.For(fx.t, wait, n.Connected, "the LISTEN session")
	return n
}

// A frontend that died in the middle of a delivery restarts under the same node id before its
// lease ran out: it takes its old delivery back at once, asks the forge what arrived, and
// sends the rest once.
func TestRestartTakesBackOwnDelivery(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	id := fx.newEval(fx.project)
	fx.addBuilds(id, 1)
	fx.setEval(id, status.EvalSucceeded, "")

	// The first process: the forge gets the first status, then the process dies.
	entered, _ := fx.forge.block(true)
	ctx, die := context.WithCancel(fx.ctx)
	done := make(chan error, 1)
	go func() { done <- fx.reporter("frontend-1").Transition(ctx, id) }()
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the first delivery never reached the forge")
	}
	die()
	<-done
	if r := fx.row(id); deref(r.Owner) != "frontend-1" {
		t.Fatalf("delivery held by %v after the crash, want frontend-1 (its lease is a minute)", deref(r.Owner))
	}

	r := fx.reporter("frontend-1", func(c *Config) { c.Notifier = fx.notifier() })
	if err := r.Start(fx.ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(r.Stop)
	waittest.For(t, wait, func() bool { return fx.released(id) }, "the delivery finished by the restarted node")
	r.Stop()
	fx.wantSent(0,
		evalStatus(id, forge.StateSuccess, "evaluated 1 attribute"),
		buildStatus(id, forge.StatePending, "0/1 builds complete"))
	if _, latest := fx.forge.calls(); latest == 0 {
		t.Error("the restarted node did not ask the forge what it shows")
	}
	fx.settled(id)
}

// observation is one Observe call.
type observation struct {
	status forge.Status
	since  time.Duration
}

// Start wires the reporter to the notifications: evaluation changes are reported at once,
// finished builds after the debounce, in both payload forms of build_jobs.
func TestStartReportsOnNotifications(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	n := fx.notifier()
	id := fx.newEval(fx.project)
	var mu sync.Mutex
	var observed []observation
	r := fx.reporter("frontend-1", func(c *Config) {
		c.Notifier = n
		c.Debounce = 50 * time.Millisecond
		c.Observe = func(evalID int64, s forge.Status, since time.Duration) {
			if evalID != id {
				t.Errorf("observed evaluation %d, want %d", evalID, id)
			}
			mu.Lock()
			defer mu.Unlock()
			observed = append(observed, observation{s, since})
		}
	})
	if err := r.Start(fx.ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(r.Stop)

	// The evaluation is open at start: reconciliation reports it.
	queued := evalStatus(id, forge.StatePending, "queued")
	waittest.For(t, wait, func() bool { return fx.forge.has(queued) }, "the queued status")

	var drvs []string
	var failedJob int64
	steps := []struct {
		name    string
		change  func()
		channel string
		payload func() string
		want    []forge.Status
	}{
		{
			name:    "evaluation starts",
			change:  func() { fx.setEval(id, status.EvalRunning, "") },
			channel: "evaluations", payload: func() string { return fmt.Sprintf(`{"id":%d,"status":"running"}`, id) },
			want: []forge.Status{evalStatus(id, forge.StatePending, "evaluating")},
		},
		{
			name: "evaluation succeeds",
			change: func() {
				drvs = fx.addBuilds(id, 2)
				fx.setEval(id, status.EvalSucceeded, "")
			},
			channel: "evaluations", payload: func() string { return fmt.Sprintf(`{"id":%d,"status":"succeeded"}`, id) },
			want: []forge.Status{
				evalStatus(id, forge.StateSuccess, "evaluated 2 attributes"),
				buildStatus(id, forge.StatePending, "0/2 builds complete"),
			},
		},
		{
			name:    "a build succeeds (announcer payload)",
			change:  func() { fx.setJob(drvs[0], status.JobSucceeded) },
			channel: "build_jobs", payload: func() string { return fmt.Sprintf(`{"status":"succeeded","drv_paths":[%q]}`, drvs[0]) },
			want: []forge.Status{buildStatus(id, forge.StatePending, "1/2 builds complete")},
		},
		{
			name: "a build fails (single payload)",
			change: func() {
				fx.setJob(drvs[1], status.JobDepFailed)
				if err := fx.pool.QueryRow(fx.ctx, `SELECT id FROM build_jobs WHERE drv_path = $1`, drvs[1]).Scan(&failedJob); err != nil {
					t.Fatal(err)
				}
			},
			channel: "build_jobs", payload: func() string { return fmt.Sprintf(`{"drv_path":%q,"status":"dep-failed"}`, drvs[1]) },
			want: []forge.Status{{Context: ContextBuild, State: forge.StateFailure, Description: "1/2 builds failed"}},
		},
	}
	want := []forge.Status{queued}
	for _, st := range steps {
		st.change()
		fx.exec(`SELECT pg_notify($1, $2)`, st.channel, st.payload())
		for _, w := range st.want {
			if w.TargetURL == "" {
				w.TargetURL = testBase + "/ci/proj/build/" + strconv.FormatInt(failedJob, 10)
			}
			waittest.For(t, wait, func() bool { return fx.forge.has(w) }, "%s: %s %q", st.name, w.Context, w.Description)
			want = append(want, w)
		}
	}
	waittest.For(t, wait, func() bool { return fx.released(id) }, "the delivery recorded and released")
	r.Stop()
	fx.wantSent(0, want...)
	if got := fx.settled(id); !got.Final {
		t.Error("report_final is false after the last build")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(observed) != len(want) {
		t.Fatalf("%d statuses observed, want %d", len(observed), len(want))
	}
	timed := 0
	for i, o := range observed {
		if o.status != want[i] {
			t.Errorf("observed %+v, want %+v", o.status, want[i])
		}
		if i >= 4 && o.since > 0 {
			timed++
		}
	}
	// The build statuses were caused by build_jobs notifications and timed from them. A
	// reconciliation (after a notifier resync, or still running from the start) may compute
	// one first, untimed; not all of them.
	if timed == 0 {
		t.Errorf("no build status was timed from its notification: %+v", observed[4:])
	}
}

// statusCalls reads harmonia_ci_commit_status_calls_total of forgeName by result and the sample
// count of its latency histogram.
func statusCalls(t *testing.T, reg *prometheus.Registry, forgeName string) (ok, failed float64, timed uint64) {
	t.Helper()
	const calls = "harmonia_ci_commit_status_calls_total"
	return metricstest.Value(t, reg, calls, "forge", forgeName, "result", "ok"),
		metricstest.Value(t, reg, calls, "forge", forgeName, "result", "error"),
		uint64(metricstest.Value(t, reg, "harmonia_ci_commit_status_call_duration_seconds", "forge", forgeName))
}
