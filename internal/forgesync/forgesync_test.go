package forgesync_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/downtest"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/forgesync"
	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/webhook"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func sha(n int) string { return fmt.Sprintf("%040x", n) }

func newGitHub(t *testing.T, srv *githubtest.Server, name, apiURL string) *forge.GitHub {
	t.Helper()
	gh, err := forge.NewGitHub(forge.GitHubConfig{Name: name, APIURL: apiURL, AppID: srv.AppID,
		PrivateKey: srv.PrivateKeyPEM, WebhookSecret: srv.WebhookSecret})
	if err != nil {
		t.Fatal(err)
	}
	return gh
}

// task returns the task called name.
func task(t *testing.T, tasks []cluster.Task, name string) cluster.Task {
	t.Helper()
	i := slices.IndexFunc(tasks, func(k cluster.Task) bool { return k.Name == name })
	if i < 0 {
		t.Fatalf("no task %s", name)
	}
	return tasks[i]
}

// run runs a task as the maintainer does: Prepare, then its write in a transaction. ran is
// false when Prepare had nothing to write.
func run(t *testing.T, pool *pgxpool.Pool, k cluster.Task) (affected int64, ran bool) {
	t.Helper()
	ctx := testCtx(t)
	w, err := k.Prepare(ctx)
	if err != nil {
		t.Fatalf("%s: Prepare: %v", k.Name, err)
	}
	if w == nil {
		return 0, false
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		affected, err = w(ctx, tx)
		return err
	})
	if err != nil {
		t.Fatalf("%s: write: %v", k.Name, err)
	}
	return affected, true
}

func TestNoForgesNoTasks(t *testing.T) {
	if tasks := forgesync.Tasks(forgesync.Config{Logger: slog.New(slog.DiscardHandler)}, nil); tasks != nil {
		t.Fatalf("Tasks without forges = %+v; want none", tasks)
	}
}

func TestDiscovery(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	srv := githubtest.New(t)
	var many []githubtest.Repo
	for i := range 150 {
		many = append(many, githubtest.Repo{FullName: fmt.Sprintf("org/repo-%03d", i)})
	}
	srv.AddInstallation(1, many...)
	srv.AddInstallation(2, githubtest.Repo{FullName: "octo/hello", DefaultBranch: "trunk", Private: true})
	srv.AddInstallation(3, githubtest.Repo{FullName: "gone/suspended"})
	srv.SuspendInstallation(3)

	// A forge that cannot be reached does not keep the others' repositories from being recorded.
	dead := downtest.URL(t)
	forges := forge.Set{"github": newGitHub(t, srv, "github", srv.URL), "down": newGitHub(t, srv, "down", dead)}
	discovery := task(t, forgesync.Tasks(forgesync.Config{Forges: forges, Logger: testLogger(t)}, pool), "forge-repositories")

	n, ran := run(t, pool, discovery)
	if !ran || n != 151 {
		t.Fatalf("discovery recorded %d rows (ran %v); want 151", n, ran)
	}
	pages := 0
	for _, r := range srv.Requests() {
		if r == "GET /installation/repositories" {
			pages++
		}
	}
	if pages != 3 {
		t.Errorf("%d requests of /installation/repositories; want 3 (2 pages of installation 1, 1 of installation 2)", pages)
	}
	rs, err := project.ListRepositories(testCtx(t), pool, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 151 {
		t.Fatalf("%d repositories recorded; want 151", len(rs))
	}
	byName := map[string]project.Repository{}
	for _, r := range rs {
		byName[r.FullName] = r
		if r.Forge != "github" {
			t.Errorf("repository %+v of forge %s; want github", r, r.Forge)
		}
	}
	for _, name := range []string{"org/repo-000", "org/repo-099", "org/repo-100", "org/repo-149"} {
		if r, ok := byName[name]; !ok || r.InstallationID != 1 || r.CloneURL != "https://github.com/"+name+".git" || r.DefaultBranch != "main" {
			t.Errorf("%s recorded as %+v (found %v); want installation 1, branch main", name, r, ok)
		}
	}
	if r := byName["octo/hello"]; r.InstallationID != 2 || r.DefaultBranch != "trunk" || !r.Private {
		t.Errorf("octo/hello recorded as %+v; want installation 2, branch trunk, private", r)
	}
	if _, ok := byName["gone/suspended"]; ok {
		t.Error("a suspended installation's repository was recorded")
	}

	// Again: the same rows, updated, not duplicated.
	if n, _ := run(t, pool, discovery); n != 151 {
		t.Fatalf("second discovery changed %d rows; want 151 upserts", n)
	}
	if rs, _ := project.ListRepositories(testCtx(t), pool, "", ""); len(rs) != 151 {
		t.Fatalf("%d repositories after the second discovery; want 151", len(rs))
	}
}

// pushed is one event the poll task handed on, and what the webhook path made of it.
type pushed struct {
	ev  forge.Event
	out webhook.Outcome
}

func TestPoll(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	pool := dbtest.NewPool(t)
	srv := githubtest.New(t)
	srv.AddInstallation(5, githubtest.Repo{FullName: "octo/hello"}, githubtest.Repo{FullName: "octo/nobranch"},
		githubtest.Repo{FullName: "octo/hooks"})
	srv.SetBranch("octo/hello", "main", sha(1))
	srv.SetBranch("octo/hooks", "main", sha(9))
	gh := newGitHub(t, srv, "github", srv.URL)
	forges := forge.Set{"github": gh}
	if _, err := forgesync.Discover(ctx, pool, gh); err != nil {
		t.Fatal(err)
	}
	rs, err := project.ListRepositories(ctx, pool, "github", "")
	if err != nil {
		t.Fatal(err)
	}
	en := project.Enabler{Pool: pool, Forges: forges, PublicURL: "http://ci.example"}
	minute := time.Minute
	projects := map[string]project.Project{}
	for _, r := range rs {
		s := project.Settings{PollInterval: &minute}
		if r.FullName == "octo/hooks" {
			s = project.Settings{} // webhooks only
		}
		p, err := en.Enable(ctx, r.ID, project.EnableParams{Settings: s})
		if err != nil {
			t.Fatal(err)
		}
		projects[r.FullName] = p
	}
	hello := projects["octo/hello"]

	recv := webhook.New(webhook.Config{Forges: forges, Logger: testLogger(t)}, pool)
	var mu sync.Mutex
	var got []pushed
	cfg := forgesync.Config{Forges: forges, Logger: testLogger(t),
		Push: func(ctx context.Context, f forge.Forge, ev forge.Event) error {
			out, err := recv.Dispatch(ctx, f, ev)
			mu.Lock()
			got = append(got, pushed{ev, out})
			mu.Unlock()
			return err
		}}
	poll := task(t, forgesync.Tasks(cfg, pool), "forge-poll")
	handed := func() []pushed {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	evals := func() []string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT commit_sha || ' ' || branch || ' ' || status FROM evaluations ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		es, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	backdate := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE projects SET last_polled = now() - interval '2 minutes' WHERE last_polled IS NOT NULL`); err != nil {
			t.Fatal(err)
		}
	}

	// First poll: the head of main goes down the webhook path as a push.
	if n, ran := run(t, pool, poll); !ran || n != 1 {
		t.Fatalf("poll marked %d projects polled (ran %v); want 1 (octo/nobranch has no main yet)", n, ran)
	}
	ps := handed()
	if len(ps) != 1 {
		t.Fatalf("Push called %d times: %+v; want once", len(ps), ps)
	}
	ev := ps[0].ev
	wantDelivery := fmt.Sprintf("poll:%d:%s", hello.ID, sha(1))
	if ev.Kind != forge.EventPush || ev.Branch != "main" || ev.After != sha(1) || ev.DeliveryID != wantDelivery ||
		ev.Repository.FullName() != "octo/hello" || ev.Repository.CloneURL != hello.RepoURL {
		t.Fatalf("Push(%+v); want a push of %s to octo/hello main, delivery %s", ev, sha(1), wantDelivery)
	}
	if out := ps[0].out; out.Code != http.StatusAccepted || out.Message != "evaluation queued" {
		t.Fatalf("webhook path answered %+v; want 202 evaluation queued", out)
	}
	if es := evals(); !slices.Equal(es, []string{sha(1) + " main queued"}) {
		t.Fatalf("evaluations %q; want %s on main, queued", es, sha(1))
	}

	// octo/hello was polled just now: not due (octo/nobranch, still due, fails again).
	if n, _ := run(t, pool, poll); n != 0 || len(handed()) != 1 {
		t.Fatalf("a poll right after the last one marked %d polled and pushed %d times; want 0 and still 1", n, len(handed()))
	}

	// Due again, head unchanged: the same delivery id, a replay, no second evaluation.
	backdate()
	if n, _ := run(t, pool, poll); n != 1 {
		t.Fatalf("second poll marked %d polled; want 1", n)
	}
	ps = handed()
	if len(ps) != 2 || ps[1].ev.DeliveryID != wantDelivery {
		t.Fatalf("Push calls %+v; want a second one with delivery %s", ps, wantDelivery)
	}
	if out := ps[1].out; out.Code != http.StatusOK || out.Message != "delivery "+wantDelivery+" was received before" {
		t.Fatalf("second poll of an unchanged head answered %+v; want 200 received before", out)
	}
	if es := evals(); len(es) != 1 {
		t.Fatalf("evaluations %q; want still one", es)
	}

	// A new head: evaluated, superseding the old one.
	srv.SetBranch("octo/hello", "main", sha(2))
	backdate()
	run(t, pool, poll)
	ps = handed()
	if len(ps) != 3 || ps[2].ev.After != sha(2) || ps[2].out.Code != http.StatusAccepted {
		t.Fatalf("Push calls %+v; want a third one of %s, accepted", ps, sha(2))
	}
	if es := evals(); !slices.Equal(es, []string{sha(1) + " main cancelled", sha(2) + " main queued"}) {
		t.Fatalf("evaluations %q; want %s cancelled, %s queued", es, sha(1), sha(2))
	}

	// octo/nobranch failed its polls (no main on the forge): it stays due, the others are not.
	due, err := project.DuePolls(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 1 || due[0].FullName != "octo/nobranch" {
		t.Fatalf("DuePolls = %+v; want only octo/nobranch", due)
	}
}
