package evalcred_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/evalcred"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/signertest"
)

// Repositories added by URL before credentials in URLs were refused: the migration moves each
// credential out of the URLs every role reads (clone URL, name, evaluations' flake URLs) into
// repository_credentials and makes the repository private; the frontend then hands it to the
// evaluator holding an evaluation, as it mints a forge's.
func TestOldURLCredentialsMoved(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := t.Context()
	cases := []struct {
		url, wantURL   string
		user, password string // the stored credential; "" user: none
		private        bool
	}{
		{"https://ci:s3cr%40t@git.example/a.git", "https://git.example/a.git", "ci", "s3cr%40t", true},
		{"https://ghp_TOKENASUSER@git.example/b.git", "https://git.example/b.git", "ghp_TOKENASUSER", "", true},
		{"ssh://git:hunter2@git.example/c.git", "ssh://git@git.example/c.git", "git", "hunter2", true},
		{"ssh://git@git.example/d.git", "ssh://git@git.example/d.git", "", "", false},
		{"https://git.example/e.git", "https://git.example/e.git", "", "", false},
		{"/srv/git/f", "/srv/git/f", "", "", false},
	}
	repos := make([]int64, len(cases))
	projects := make([]int64, len(cases))
	for i, c := range cases {
		repos[i] = queuetest.QueryInt(t, pool, `
INSERT INTO repositories (forge, owner, name, full_name, clone_url) VALUES ('git', '', $1, $1, $1) RETURNING id`, c.url)
		projects[i] = queuetest.QueryInt(t, pool, `INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`, repos[i], fmt.Sprint("p", i))
	}
	oldEval := queuetest.QueryInt(t, pool, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch)
VALUES ($1, 'git+https://ci:s3cr%40t@git.example/a.git?rev=' || repeat('a', 40), repeat('a', 40), 'main') RETURNING id`, projects[0])

	// The schema is current: run the migration again on a table of its own making.
	queuetest.Exec(t, pool, `DROP TABLE repository_credentials`)
	ms, err := db.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var ran bool
	for _, m := range ms {
		if m.Name == "url_credentials" {
			queuetest.Exec(t, pool, m.SQL)
			ran = true
		}
	}
	if !ran {
		t.Fatal("no url_credentials migration")
	}

	for i, c := range cases {
		var url, name string
		var private bool
		if err := pool.QueryRow(ctx, `SELECT clone_url, full_name, is_private FROM repositories WHERE id = $1`, repos[i]).
			Scan(&url, &name, &private); err != nil {
			t.Fatal(err)
		}
		if url != c.wantURL || name != c.wantURL || private != c.private {
			t.Errorf("%s: now %q named %q, private %v; want %q, private %v", c.url, url, name, private, c.wantURL, c.private)
		}
		var user, password string
		err := pool.QueryRow(ctx, `SELECT username, password FROM repository_credentials WHERE repo_id = $1`, repos[i]).Scan(&user, &password)
		if c.user == "" {
			if err == nil {
				t.Errorf("%s: credential %q:%q stored; want none", c.url, user, password)
			}
			continue
		}
		if err != nil || user != c.user || password != c.password {
			t.Errorf("%s: stored %q:%q (%v); want %q:%q", c.url, user, password, err, c.user, c.password)
		}
	}
	var flake string
	if err := pool.QueryRow(ctx, `SELECT flake_url FROM evaluations WHERE id = $1`, oldEval).Scan(&flake); err != nil {
		t.Fatal(err)
	}
	if want := "git+https://git.example/a.git?rev=" + strings.Repeat("a", 40); flake != want {
		t.Errorf("old evaluation's flake URL %q; want %q", flake, want)
	}

	// The frontend hands the stored credential to the evaluator that holds an evaluation.
	cl := signertest.Start(t, pool, signertest.Options{KeyName: "evalcred-stored-1"})
	mux := http.NewServeMux()
	evalcred.New(evalcred.Config{Tickets: cl.Client(t, "front-1", config.RoleFrontend), Logger: queuetest.TestLogger(t)}, pool).
		Register(access.NewRoutes(mux, nil))
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	ask := func(project int64) (int, string) {
		id := queuetest.QueryInt(t, pool, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at, attempt)
VALUES ($1, 'x', md5($2), 'main', 'running', 'eval-1', now(), now(), 1) RETURNING id`, project, fmt.Sprint(project))
		tk, err := cl.Client(t, "eval-1", config.RoleEvaluator).EvalTicket(ctx, signerapi.EvalClaim{ID: id, Attempt: 1})
		if err != nil {
			t.Fatal(err)
		}
		return post(t, ts.URL, evalcred.Request{Ticket: tk.Ticket})
	}
	for _, tt := range []struct {
		project int64
		want    gitrepo.Credential
		code    int
		msg     string
	}{
		{project: projects[0], want: gitrepo.Credential{URL: "https://git.example/a.git", Username: "ci", Token: "s3cr@t"}, code: 200},
		{project: projects[1], want: gitrepo.Credential{URL: "https://git.example/b.git", Username: "ghp_TOKENASUSER"}, code: 200},
		{project: projects[2], code: http.StatusConflict, msg: "use a key the evaluator nodes hold"},
		{project: projects[4], code: http.StatusNotFound, msg: "forge is not configured"},
	} {
		code, body := ask(tt.project)
		if code != tt.code {
			t.Errorf("project %d: %d %s; want %d", tt.project, code, body, tt.code)
			continue
		}
		if code != http.StatusOK {
			if !strings.Contains(body, tt.msg) || strings.Contains(body, "hunter2") {
				t.Errorf("project %d: refusal %s; want it to say %q and hold no password", tt.project, body, tt.msg)
			}
			continue
		}
		var got gitrepo.Credential
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatal(err)
		}
		if got != tt.want {
			t.Errorf("project %d: credential %#v (user %q, token %q); want user %q, token %q", tt.project, got, got.Username, got.Token, tt.want.Username, tt.want.Token)
		}
	}
}
