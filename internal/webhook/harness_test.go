package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/downtest"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/forgesync"
	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/webhook"
)

// installationID is the App installation holding the test repositories.
const installationID = 42

// cloneURL is where the stand-in says octo/hello is cloned from; evaluations must use it (as
// recorded by discovery), whatever a delivery's payload claims.
const cloneURL = "https://git.example.com/octo/hello.git"

var hello = githubtest.Repo{FullName: "octo/hello", CloneURL: cloneURL}

// sha is a made-up commit id, distinct for each n > 0.
func sha(n int) string { return fmt.Sprintf("%040x", n) }

// options adjust setup.
type options struct {
	maxBody     int64
	maxInFlight int
	// onChanged replaces the OnRepositoriesChanged that sends to bundle.changed.
	onChanged func(forgeName string)
}

// bundle is one test's world: a stand-in GitHub with installation 42 holding octo/hello
// (discovered and enabled as project "hello"), the GitHub forge talking to it, and the
// receiver served over HTTP.
type bundle struct {
	gh     *githubtest.Server
	forge  *forge.GitHub
	pool   *pgxpool.Pool
	enable project.Enabler
	url    string // the receiver's /webhook/github
	base   string // the receiver's base URL
	repoID int64
	// changed receives the forge names OnRepositoriesChanged is called with.
	changed chan string
	// down makes every call to the stand-in go to a closed port instead.
	down atomic.Bool
	// reg holds the receiver's series.
	reg *prometheus.Registry
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// switchTransport sends requests to a forge that is down while down is set.
type switchTransport struct {
	down *atomic.Bool
	dead string
}

func (s switchTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if s.down.Load() {
		r = r.Clone(r.Context())
		r.URL.Host = s.dead
	}
	return http.DefaultTransport.RoundTrip(r)
}

func setup(t *testing.T, opt options) *bundle {
	t.Helper()
	ctx := testCtx(t)
	b := &bundle{gh: githubtest.New(t), pool: dbtest.NewPool(t), changed: make(chan string, 4), reg: prometheus.NewRegistry()}
	b.gh.AddInstallation(installationID, hello, githubtest.Repo{FullName: "octo/other"})
	b.gh.AddCollaborator(hello.FullName, "alice")
	var err error
	b.forge, err = forge.NewGitHub(forge.GitHubConfig{Name: "github", APIURL: b.gh.URL, AppID: b.gh.AppID,
		PrivateKey: b.gh.PrivateKeyPEM, WebhookSecret: b.gh.WebhookSecret,
		HTTPClient: &http.Client{Timeout: 10 * time.Second, Transport: switchTransport{down: &b.down, dead: strings.TrimPrefix(downtest.URL(t), "http://")}}})
	if err != nil {
		t.Fatal(err)
	}
	// Discovery: App JWT → installation token → /installation/repositories.
	if n, err := forgesync.Discover(ctx, b.pool, b.forge); err != nil || n != 2 {
		t.Fatalf("Discover = %d, %v; want 2 repositories recorded", n, err)
	}
	repos, err := project.ListRepositories(ctx, b.pool, "github", hello.FullName)
	if err != nil || len(repos) != 1 {
		t.Fatalf("ListRepositories(github, %s) = %+v, %v", hello.FullName, repos, err)
	}
	if r := repos[0]; r.CloneURL != cloneURL || r.InstallationID != installationID || r.DefaultBranch != "main" {
		t.Fatalf("discovered %+v; want clone URL %s, installation %d, branch main", r, cloneURL, installationID)
	}
	b.repoID = repos[0].ID
	forges := forge.Set{"github": b.forge}
	b.enable = project.Enabler{Pool: b.pool, Forges: forges, PublicURL: "http://ci.example"}
	if p, err := b.enable.Enable(ctx, b.repoID, project.EnableParams{}); err != nil || p.Name != "hello" || !p.Enabled {
		t.Fatalf("Enable = %+v, %v; want enabled project hello", p, err)
	}

	changed := func(name string) { b.changed <- name }
	if opt.onChanged != nil {
		changed = opt.onChanged
	}
	recv := webhook.New(webhook.Config{Forges: forges, MaxBody: map[string]int64{"github": opt.maxBody}, MaxInFlight: opt.maxInFlight,
		Logger: testLogger(t), OnRepositoriesChanged: changed, Registerer: b.reg}, b.pool)
	mux := http.NewServeMux()
	recv.Register(access.NewRoutes(mux, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	b.base = srv.URL
	b.url = srv.URL + "/webhook/github"
	return b
}

// configure changes the project's settings.
func (b *bundle) configure(t *testing.T, s project.Settings) {
	t.Helper()
	if _, err := project.Configure(testCtx(t), b.pool, b.repoID, s); err != nil {
		t.Fatalf("Configure(%+v): %v", s, err)
	}
}

// answer is the receiver's response.
type answer struct {
	code int
	msg  string // "message", or "error" for a failure
	eval int64
}

func (b *bundle) read(t *testing.T, resp *http.Response, err error) answer {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Message    string `json:"message"`
		Error      string `json:"error"`
		Evaluation int64  `json:"evaluation"`
	}
	if err := json.Unmarshal(data, &body); err != nil {
		t.Fatalf("%d answer %q: %v", resp.StatusCode, data, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	return answer{code: resp.StatusCode, msg: body.Message + body.Error, eval: body.Evaluation}
}

// deliver delivers payload as GitHub does, with a fresh delivery id.
func (b *bundle) deliver(t *testing.T, event string, payload any) answer {
	t.Helper()
	resp, err := b.gh.Deliver(testCtx(t), b.url, event, payload)
	return b.read(t, resp, err)
}

// deliverID delivers payload with delivery id id (a GitHub redelivery, or a replay).
func (b *bundle) deliverID(t *testing.T, event, id string, payload any) answer {
	t.Helper()
	body, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	h := b.gh.WebhookHeader(event, body)
	h.Set("X-GitHub-Delivery", id)
	return b.post(t, b.url, h, body)
}

// post sends body with header h to url.
func (b *bundle) post(t *testing.T, url string, h http.Header, body []byte) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	return b.read(t, resp, err)
}

// evalRow is an evaluations row as the tests look at it.
type evalRow struct {
	ID       int64
	Status   status.EvalStatus
	Branch   string
	Commit   string
	FlakeURL string
	TreeHash string
	PRNumber int
	PRAuthor string
	Error    string
}

func (b *bundle) evals(t *testing.T) []evalRow {
	t.Helper()
	rows, err := b.pool.Query(testCtx(t), `
SELECT id, status, branch, commit_sha, flake_url, COALESCE(tree_hash, ''), COALESCE(pr_number, 0),
       COALESCE(pr_author, ''), COALESCE(error, '')
FROM evaluations ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	es, err := pgx.CollectRows(rows, pgx.RowToStructByPos[evalRow])
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// deliveries maps the recorded delivery ids to their evaluation (0: none).
func (b *bundle) deliveries(t *testing.T) map[string]int64 {
	t.Helper()
	rows, err := b.pool.Query(testCtx(t), `SELECT forge || ':' || delivery_id, COALESCE(eval_id, 0) FROM webhook_deliveries`)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	var id string
	var eval int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &eval}, func() error { m[id] = eval; return nil }); err != nil {
		t.Fatal(err)
	}
	return m
}

// nothingRecorded fails unless there is no evaluation and no delivery row.
func (b *bundle) nothingRecorded(t *testing.T) {
	t.Helper()
	if es, ds := b.evals(t), b.deliveries(t); len(es) != 0 || len(ds) != 0 {
		t.Fatalf("recorded evaluations %+v and deliveries %v; want none", es, ds)
	}
}

// push is the payload of a push of commit after to branch of repo.
func push(repo githubtest.Repo, branch, after string) map[string]any {
	return githubtest.PushPayload(githubtest.Push{Repo: repo, Ref: "refs/heads/" + branch, After: after,
		Sender: "octo", Installation: installationID})
}

// pushFrom is the payload of a push moving branch from before to after: another body than
// push's for the same commit, as a forge sends for a second push of it.
func pushFrom(repo githubtest.Repo, branch, before, after string) map[string]any {
	return githubtest.PushPayload(githubtest.Push{Repo: repo, Ref: "refs/heads/" + branch, Before: before, After: after,
		Sender: "octo", Installation: installationID})
}

// pullRequest is the payload of a pull_request event on octo/hello.
func pullRequest(action string, pr githubtest.PR) map[string]any {
	return githubtest.PullRequestPayload(githubtest.PullRequestEvent{Action: action, Repo: hello, PR: pr,
		Installation: installationID})
}

// comment is the payload of a comment created on pull request n of octo/hello.
func comment(n int, commenter, body string) map[string]any {
	return githubtest.CommentPayload(githubtest.Comment{Action: "created", Repo: hello, Number: n,
		OnPullRequest: true, Commenter: commenter, Body: body, Installation: installationID})
}
