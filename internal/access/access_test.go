package access_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestMayRead(t *testing.T) {
	t.Parallel()
	private := access.Repo{Private: true, Forge: "gitea", FullName: "o/secret"}
	user := access.Caller{Kind: access.User, Forge: "gitea", Login: "ann", UserID: 3}
	errForge := errors.New("forge down")
	for _, tt := range []struct {
		name    string
		caller  access.Caller
		repo    access.Repo
		forge   func() (bool, error) // nil: no forge reachable
		want    bool
		wantErr error
		asked   bool
	}{
		{"public, anonymous", access.Caller{}, access.Repo{Forge: "gitea", FullName: "o/r"}, nil, true, nil, false},
		{"private, anonymous", access.Caller{}, private, func() (bool, error) { return true, nil }, false, nil, false},
		{"private, admin token", access.Caller{Kind: access.AdminToken, Admin: true}, private, nil, true, nil, false},
		{"private, admin user", access.Caller{Kind: access.User, Admin: true, Forge: "github"}, private, nil, true, nil, false},
		{"private, node", access.Caller{Kind: access.Node, NodeID: "b1"}, private, nil, true, nil, false},
		{"private, reader", user, private, func() (bool, error) { return true, nil }, true, nil, true},
		{"private, no read access", user, private, func() (bool, error) { return false, nil }, false, nil, true},
		{"private, forge down", user, private, func() (bool, error) { return false, errForge }, false, errForge, true},
		{"private, no forge here", user, private, nil, false, nil, false},
		{"private, user of another forge", access.Caller{Kind: access.User, Forge: "github", Login: "ann"}, private,
			func() (bool, error) { return true, nil }, false, nil, false},
		{"private, machine token of its project", access.Caller{Kind: access.MachineToken, TokenID: 3, Repos: []string{"gitea/o/secret"}},
			private, nil, true, nil, false},
		{"private, machine token of other projects", access.Caller{Kind: access.MachineToken, TokenID: 3, Repos: []string{"gitea/o/q"}},
			private, nil, false, nil, false},
		{"private project added by URL", access.Caller{Kind: access.User, Forge: "git", Login: "ann"},
			access.Repo{Private: true, Forge: "git", FullName: "https://x/y.git"}, func() (bool, error) { return true, nil }, false, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			asked := false
			rule := &access.Rule{}
			if tt.forge != nil {
				rule.Read = func(_ context.Context, c access.Caller, repo access.Repo) (bool, error) {
					asked = true
					if !reflect.DeepEqual(c, tt.caller) || repo != tt.repo {
						t.Errorf("forge asked about %v on %v", c, repo)
					}
					return tt.forge()
				}
			}
			got, err := rule.MayRead(t.Context(), tt.caller, tt.repo)
			if got != tt.want || !errors.Is(err, tt.wantErr) || asked != tt.asked {
				t.Errorf("MayRead = %v, %v (forge asked %v); want %v, %v (asked %v)", got, err, asked, tt.want, tt.wantErr, tt.asked)
			}
		})
	}
}

// fixture is a database with a public project "open" and a private one "hush", each with an
// evaluation and a job; the job "shared" is the private project's but the public evaluation
// has it as an attribute; "orphan" is no project's.
type fixture struct {
	pool                           *pgxpool.Pool
	open, hush                     int64
	openEval, hushEval             int64
	openJob, hushJob, shared, orph int64
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := dbtest.NewPool(t)
	ctx := t.Context()
	id := func(sql string, args ...any) int64 {
		t.Helper()
		var id int64
		if err := pool.QueryRow(ctx, sql, args...).Scan(&id); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return id
	}
	fx := &fixture{pool: pool}
	project := func(name string, private bool) (int64, int64) {
		r := id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private)
VALUES ('gitea', 'o', $1, 'o/' || $1, 'https://x/' || $1, $2) RETURNING id`, name, private)
		p := id(`INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`, r, name)
		e := id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch) VALUES ($1, 'x', repeat('a', 40), 'main') RETURNING id`, p)
		return p, e
	}
	fx.open, fx.openEval = project("open", false)
	fx.hush, fx.hushEval = project("hush", true)
	n := 0
	job := func(project any, evals ...int64) int64 {
		n++
		drv := fmt.Sprintf("/nix/store/%032d-d.drv", n)
		id(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, 'd', 'x86_64-linux', 'sha256:0', 0) RETURNING 1`, drv, fmt.Sprintf("%032d", n))
		j := id(`INSERT INTO build_jobs (drv_path, project_id, system) VALUES ($1, $2, 'x86_64-linux') RETURNING id`, drv, project)
		for i, e := range evals {
			id(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3) RETURNING id`, e, fmt.Sprint("a", n, "-", i), drv)
		}
		return j
	}
	fx.openJob = job(fx.open, fx.openEval)
	fx.hushJob = job(fx.hush, fx.hushEval)
	fx.shared = job(fx.hush, fx.hushEval, fx.openEval)
	fx.orph = job(nil)
	return fx
}

func TestMayReadObjects(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	rule := &access.Rule{DB: fx.pool}
	anon := access.Caller{}
	admin := access.Caller{Kind: access.AdminToken, Admin: true}
	for _, tt := range []struct {
		name      string
		check     func(access.Caller) (bool, error)
		anon, adm bool
	}{
		{"public project", func(c access.Caller) (bool, error) { return rule.MayReadProject(t.Context(), c, "open") }, true, true},
		{"private project", func(c access.Caller) (bool, error) { return rule.MayReadProject(t.Context(), c, "hush") }, false, true},
		{"private project by id", func(c access.Caller) (bool, error) { return rule.MayReadProjectID(t.Context(), c, fx.hush) }, false, true},
		{"no such project", func(c access.Caller) (bool, error) { return rule.MayReadProject(t.Context(), c, "none") }, false, false},
		{"public evaluation", func(c access.Caller) (bool, error) { return rule.MayReadEval(t.Context(), c, fx.openEval) }, true, true},
		{"private evaluation", func(c access.Caller) (bool, error) { return rule.MayReadEval(t.Context(), c, fx.hushEval) }, false, true},
		{"no such evaluation", func(c access.Caller) (bool, error) { return rule.MayReadEval(t.Context(), c, 99999) }, false, false},
		{"public job", func(c access.Caller) (bool, error) { return rule.MayReadJob(t.Context(), c, fx.openJob) }, true, true},
		{"private job", func(c access.Caller) (bool, error) { return rule.MayReadJob(t.Context(), c, fx.hushJob) }, false, true},
		{"private job a public evaluation builds", func(c access.Caller) (bool, error) { return rule.MayReadJob(t.Context(), c, fx.shared) }, true, true},
		{"job of no project", func(c access.Caller) (bool, error) { return rule.MayReadJob(t.Context(), c, fx.orph) }, true, true},
		{"no such job", func(c access.Caller) (bool, error) { return rule.MayReadJob(t.Context(), c, 99999) }, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range []struct {
				caller access.Caller
				want   bool
			}{{anon, tt.anon}, {admin, tt.adm}} {
				if got, err := tt.check(c.caller); err != nil || got != c.want {
					t.Errorf("as %s: %v, %v; want %v", c.caller, got, err, c.want)
				}
			}
		})
	}
}

// A checked route answers a caller who may not read its object exactly as it answers for an
// object that does not exist, and runs its handler otherwise.
func TestRoutesCheck(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	mux := http.NewServeMux()
	rt := access.NewRoutes(mux, nil)
	rt.Use(&access.Rule{DB: fx.pool}, func(r *http.Request) access.Caller {
		if r.Header.Get("Authorization") == "Bearer admin" {
			return access.Caller{Kind: access.AdminToken, Admin: true}
		}
		return access.Caller{}
	})
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "served") })
	rt.Handle("GET /p/{project}", access.Project("project"), ok)
	rt.Handle("GET /e/{id}", access.Eval("id"), ok)
	rt.Handle("GET /j/{id}", access.Job("id"), ok)
	rt.Handle("GET /d/{id}", access.Job("id").Deny(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "nothing here", http.StatusNotFound)
	}), ok)
	rt.Handle("GET /free", access.Free, ok)

	get := func(path, auth string) (int, string) {
		req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		rt.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	for _, tt := range []struct {
		path, auth string
		code       int
		body       string
	}{
		{"/p/open", "", 200, "served"},
		{"/p/hush", "", 404, "{\n  \"error\": \"project hush not found\"\n}\n"},
		{"/p/none", "", 404, "{\n  \"error\": \"project none not found\"\n}\n"},
		{"/p/hush", "Bearer admin", 200, "served"},
		{fmt.Sprintf("/e/%d", fx.openEval), "", 200, "served"},
		{fmt.Sprintf("/e/%d", fx.hushEval), "", 404, fmt.Sprintf("{\n  \"error\": \"evaluation %d not found\"\n}\n", fx.hushEval)},
		{fmt.Sprintf("/j/%d", fx.hushJob), "", 404, fmt.Sprintf("{\n  \"error\": \"build %d not found\"\n}\n", fx.hushJob)},
		{fmt.Sprintf("/j/%d", fx.shared), "", 200, "served"},
		{"/j/abc", "", 200, "served"}, // malformed: the handler answers it
		{fmt.Sprintf("/d/%d", fx.hushJob), "", 404, "nothing here\n"},
		{"/d/99999", "", 404, "nothing here\n"},
		{"/free", "", 200, "served"},
	} {
		if code, body := get(tt.path, tt.auth); code != tt.code || body != tt.body {
			t.Errorf("GET %s (%q): %d %q, want %d %q", tt.path, tt.auth, code, body, tt.code, tt.body)
		}
	}
	want := []access.ScopeKind{access.KindProject, access.KindEval, access.KindJob, access.KindJob, access.KindFree}
	got := rt.List()
	if len(got) != len(want) {
		t.Fatalf("List: %v", got)
	}
	for i, r := range got {
		if r.Scope.Kind != want[i] {
			t.Errorf("route %s: %s, want %s", r.Pattern, r.Scope.Kind, want[i])
		}
	}
}

func TestHandleRefusesARouteWithoutScope(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Error("a route without a scope was registered")
		}
	}()
	access.NewRoutes(http.NewServeMux(), nil).Handle("GET /x", access.Scope{}, http.NotFoundHandler())
}

// An open stream ends once its caller may no longer read what it streams (a logout, a
// withdrawn permission), and goes on while they still may.
func TestRevokedEndsAStream(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	mux := http.NewServeMux()
	rt := access.NewRoutes(mux, nil)
	var admin atomic.Bool
	admin.Store(true)
	rt.Use(&access.Rule{DB: fx.pool}, func(*http.Request) access.Caller {
		if admin.Load() {
			return access.Caller{Kind: access.AdminToken, Admin: true}
		}
		return access.Caller{}
	})
	rt.SetRecheckInterval(10 * time.Millisecond)
	opened := make(chan struct{}, 1)
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opened <- struct{}{}
		select {
		case <-access.Revoked(r):
			io.WriteString(w, "revoked")
		case <-time.After(300 * time.Millisecond): // at least 30 rechecks: still allowed
			io.WriteString(w, "still open")
		}
	})
	rt.Handle("GET /e/{id}", access.Eval("id"), stream)
	rt.Handle("GET /free", access.Free, stream)

	serve := func(path string) <-chan string {
		got := make(chan string, 1)
		go func() {
			rec := httptest.NewRecorder()
			rt.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil))
			got <- rec.Body.String()
		}()
		return got
	}
	private := fmt.Sprintf("/e/%d", fx.hushEval)
	got := serve(private)
	<-opened
	if got := <-got; got != "still open" {
		t.Fatalf("private stream while admin: %q", got)
	}
	for _, tt := range []struct{ path, want string }{
		{private, "revoked"},
		{fmt.Sprintf("/e/%d", fx.openEval), "still open"},
		{"/free", "still open"},
	} {
		admin.Store(true)
		got := serve(tt.path)
		<-opened
		admin.Store(false) // the admin logs out as the stream runs
		if g := <-got; g != tt.want {
			t.Errorf("%s after logout: %q, want %q", tt.path, g, tt.want)
		}
	}
}
