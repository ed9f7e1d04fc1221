package node_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// Markers of the private project's data: none may reach a caller who may not read it.
const (
	hushProject = "hush-7q"          // the private project's name (and repository octo/hush-7q)
	hushAttr    = "hush-attr-k2"     // its evaluation's attribute, the derivation's name
	hushLog     = "HUSH-LOG-LINE-x9" // its running build's live log
	urlToken    = "tok3n-zz81"       // the credential in an old row's clone URL
	adminToken  = "visibility-admin-token"
)

// declared is what every route of a node with every HTTP role (frontend, signer, cache) is
// declared to carry. A route registered without a declaration cannot exist (access.Routes is
// the server's only way to register, and Handle refuses a route without a scope); a new route
// fails this test until it is listed here, so whoever adds one says what it carries, and the
// probes below hold the declaration to the answers.
var declared = map[string]access.ScopeKind{
	"GET /healthz":                                 access.KindFree,
	"GET /metrics":                                 access.KindFiltered,
	"GET /api/cluster":                             access.KindFree,
	"POST /api/nodes/{id}/drain":                   access.KindAdmin,
	"GET /api/builds/{id}/log":                     access.KindJob,
	"GET /nix-cache-info":                          access.KindFree,
	"GET /{name}":                                  access.KindStorePath,
	"GET /nar/{file}":                              access.KindStorePath,
	"GET /log/{drv}":                               access.KindStorePath,
	"POST /api/upload-slots":                       access.KindSigned,
	"POST /api/build-complete":                     access.KindSigned,
	"POST /api/publish":                            access.KindSigned,
	"POST /api/cache-lookup":                       access.KindSigned,
	"PUT /api/blob/{key...}":                       access.KindSigned,
	"GET /api/repositories":                        access.KindAdmin,
	"POST /api/projects/{repo_id}/enable":          access.KindAdmin,
	"POST /api/projects/{repo_id}/disable":         access.KindAdmin,
	"POST /api/projects/{repo_id}/settings":        access.KindAdmin,
	"GET /ci/static/":                              access.KindFree,
	"GET /{$}":                                     access.KindFree,
	"GET /ci/{$}":                                  access.KindFiltered,
	"GET /ci/{project}/{rest...}":                  access.KindProject,
	"GET /ci/nodes":                                access.KindFree,
	"GET /ci/queue":                                access.KindFiltered,
	"GET /api/events/dashboard":                    access.KindFiltered,
	"GET /api/events/eval/{id}":                    access.KindEval,
	"GET /ci/login":                                access.KindFree,
	"GET /ci/login/{forge}":                        access.KindFree,
	"GET /ci/oauth/{forge}/callback":               access.KindFree,
	"POST /ci/logout":                              access.KindFree,
	"POST /api/builds/{id}/rebuild":                access.KindJob,
	"POST /api/builds/{id}/cancel":                 access.KindJob,
	"POST /api/evals/{id}/rebuild-failed":          access.KindEval,
	"POST /api/evals/{id}/re-evaluate":             access.KindEval,
	"POST /api/evals/{id}/cancel":                  access.KindEval,
	"GET /ci/settings/projects":                    access.KindAdmin,
	"GET /ci/settings/projects/{repo_id}":          access.KindAdmin,
	"POST /ci/settings/projects/{repo_id}":         access.KindAdmin,
	"POST /ci/settings/projects/{repo_id}/enable":  access.KindAdmin,
	"POST /ci/settings/projects/{repo_id}/disable": access.KindAdmin,
	"GET /ci/tokens":                               access.KindFiltered,
	"POST /ci/tokens":                              access.KindFiltered,
	"POST /ci/tokens/{id}/revoke":                  access.KindFiltered,
	"POST /ci/tokens/api":                          access.KindFiltered,
	"POST /ci/tokens/api/{id}/revoke":              access.KindFiltered,
	"GET /ci/tokens/cli":                           access.KindFree,
	"POST /ci/tokens/cli":                          access.KindFree,
	"POST /webhook/{forge}":                        access.KindSigned,
	"POST /webhook/{forge}/{repo}":                 access.KindSigned,
	"POST /api/eval-ticket":                        access.KindSigned,
	"POST /api/eval-ticket/check":                  access.KindSigned,
	"POST /api/node-token/check":                   access.KindSigned,
	"POST /api/eval-credential":                    access.KindSigned,
	"GET /api/v1/projects":                         access.KindFiltered,
	"GET /api/v1/projects/{project}":               access.KindProject,
	"GET /api/v1/projects/{project}/evaluations":   access.KindProject,
	"GET /api/v1/evaluations/{id}":                 access.KindEval,
	"GET /api/v1/evaluations/{id}/failures":        access.KindEval,
	"GET /api/v1/evaluations/{id}/diff":            access.KindEval,
	"GET /api/v1/builds/{id}":                      access.KindJob,
	"GET /api/v1/nodes":                            access.KindFree,
	"GET /api/v1/queue":                            access.KindFiltered,
	"GET /api/v1/openapi.json":                     access.KindFree,
}

// visFixture is an in-process node with the frontend, signer and cache roles, its routes
// served by a test server, a stand-in GitHub (installation 7: octo/app public, octo/hush-7q
// private and read by "friend"), and a private project's evaluation with a running build.
type visFixture struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	gh     *githubtest.Server
	routes *access.Routes
	srv    *httptest.Server

	hushRepo, evalID, jobID int64
	appEval, byURLRepo      int64
}

func newVisFixture(t *testing.T) *visFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	gh := githubtest.New(t)
	gh.AddInstallation(7, githubtest.Repo{FullName: "octo/app"}, githubtest.Repo{FullName: "octo/" + hushProject, Private: true})
	gh.SetPermission("octo/"+hushProject, "friend", "read")

	cfg := config.Default()
	cfg.DatabaseURL, cfg.StateDir, cfg.Listen = dbtest.NewDB(t), t.TempDir(), "127.0.0.1:0"
	cfg.Node.ID = "vis"
	cfg.Node.Roles = []string{config.RoleFrontend, config.RoleSigner, config.RoleCache}
	cfg.Auth.ClusterSecret, cfg.Auth.Secret, cfg.Auth.AdminToken = randomHex(t), randomHex(t), adminToken
	key, err := nix.GenerateKey("visibility-1")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Signer.SigningKeyFile = filepath.Join(cfg.StateDir, "signing-key")
	if err := key.WriteFile(cfg.Signer.SigningKeyFile, true); err != nil {
		t.Fatal(err)
	}
	cfg.Forges = []config.ForgeConfig{{Name: "github", Type: config.ForgeGitHub, URL: gh.URL, APIURL: gh.URL,
		AppID: int(gh.AppID), PrivateKey: string(gh.PrivateKeyPEM), WebhookSecret: string(gh.WebhookSecret),
		OAuthClientID: gh.OAuthClientID, OAuthClientSecret: gh.OAuthClientSecret}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	routes := make(chan *access.Routes, 1)
	ready, done := make(chan struct{}), make(chan struct{})
	nctx, stop := context.WithCancel(context.Background())
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	var runErr error
	go func() {
		defer close(done)
		runErr = node.Run(nctx, cfg, logger, node.Options{Version: "test",
			Routes: func(rt *access.Routes) { routes <- rt }, Ready: func() { close(ready) }})
	}()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-ready:
	case <-done:
		t.Fatalf("node stopped before it was ready: %v", runErr)
	case <-ctx.Done():
		t.Fatal("node not ready")
	}
	fx := &visFixture{t: t, ctx: ctx, gh: gh, routes: <-routes}
	fx.srv = httptest.NewServer(fx.routes)
	t.Cleanup(fx.srv.Close)
	fx.pool = dbtest.PoolAs(t, cfg.DatabaseURL, "")
	fx.seed()
	return fx
}

func randomHex(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func (fx *visFixture) id(sql string, args ...any) int64 {
	fx.t.Helper()
	return queuetest.QueryInt(fx.t, fx.pool, sql, args...)
}

// repo records a repository as discovery would (which may have recorded it already).
func (fx *visFixture) repo(forge, fullName, cloneURL string, private bool) int64 {
	owner, name, _ := strings.Cut(fullName, "/")
	return fx.id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private, installation_id)
VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $1 = 'github' THEN 7 END)
ON CONFLICT (forge, full_name) DO UPDATE SET is_private = EXCLUDED.is_private RETURNING id`,
		forge, owner, name, fullName, cloneURL, private)
}

// seed records the private project with an evaluation and a running build with a live log,
// a public project's evaluation, and a project added by URL before credentials were refused.
func (fx *visFixture) seed() {
	fx.hushRepo = fx.repo("github", "octo/"+hushProject, "https://github.example/octo/"+hushProject+".git", true)
	hush := fx.id(`INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`, fx.hushRepo, hushProject)
	fx.evalID = fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, started_at, finished_at)
VALUES ($1, 'git+https://github.example/octo/hush.git', repeat('a', 40), 'main', 'succeeded', now(), now()) RETURNING id`, hush)
	drv := "/nix/store/" + strings.Repeat("1", 32) + "-" + hushAttr + ".drv"
	fx.id(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, $3, 'x86_64-linux', 'sha256:0', 0) RETURNING 1`, drv, strings.Repeat("1", 32), hushAttr)
	fx.jobID = fx.id(`INSERT INTO build_jobs (drv_path, project_id, system, status, claimed_by, claimed_at, started_at)
VALUES ($1, $2, 'x86_64-linux', 'building', 'vis', now(), now()) RETURNING id`, drv, hush)
	fx.id(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3) RETURNING id`, fx.evalID, hushAttr, drv)
	fx.id(`INSERT INTO build_log_tails (build_job_id, log_tail, log_seq) VALUES ($1, $2, 1) RETURNING 1`, fx.jobID, []byte(hushLog+"\n"))
	fx.id(`UPDATE projects SET consumed_seconds = 5 WHERE id = $1 RETURNING 1`, hush)

	app := fx.id(`INSERT INTO projects (repo_id, name) VALUES ($1, 'app') RETURNING id`,
		fx.repo("github", "octo/app", "https://github.example/octo/app.git", false))
	fx.appEval = fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status)
VALUES ($1, 'git+https://github.example/octo/app.git', repeat('b', 40), 'main', 'queued') RETURNING id`, app)
	byURL := "https://bob:" + urlToken + "@git.example/x.git"
	fx.byURLRepo = fx.repo("git", byURL, byURL, false)
	fx.id(`INSERT INTO projects (repo_id, name) VALUES ($1, 'byurl') RETURNING id`, fx.byURLRepo)
}

// postJSON POSTs body as JSON with the client's credentials.
func (c *client) postJSON(path, body string) int {
	c.fx.t.Helper()
	req, err := http.NewRequestWithContext(c.fx.ctx, http.MethodPost, c.fx.srv.URL+path, strings.NewReader(body))
	if err != nil {
		c.fx.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.fx.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// client is a caller: anonymous, a session (a cookie jar) or the admin token.
type client struct {
	fx     *visFixture
	http   *http.Client
	bearer string
}

func (fx *visFixture) client() *client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		fx.t.Fatal(err)
	}
	return &client{fx: fx, http: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// do sends a request and reads the answer: all of it, or for an event stream what arrives
// until the stream's first event past its "retry" line (or 5 s).
func (c *client) do(method, path string, header map[string]string) (int, string) {
	code, body, _ := c.send(method, path, header)
	return code, body
}

// send is do, with the redirect's target.
func (c *client) send(method, path string, header map[string]string) (int, string, string) {
	c.fx.t.Helper()
	ctx, cancel := context.WithTimeout(c.fx.ctx, 5*time.Second)
	defer cancel()
	rawURL := path
	if strings.HasPrefix(path, "/") {
		rawURL = c.fx.srv.URL + path
	}
	req, err := http.NewRequestWithContext(ctx, method, rawURL, nil)
	if err != nil {
		c.fx.t.Fatal(err)
	}
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.fx.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var loc string
	if l, err := resp.Location(); err == nil {
		loc = l.String()
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), loc
	}
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		s := strings.TrimPrefix(got.String(), "retry: 2000\n\n")
		if strings.Contains(s, "\n\n") || err != nil {
			return resp.StatusCode, got.String(), loc
		}
	}
}

func (c *client) get(path string) (int, string) { return c.do(http.MethodGet, path, nil) }

// login logs the client in as login through the stand-in GitHub's OAuth flow.
func (c *client) login(login string) *client {
	c.fx.t.Helper()
	c.fx.gh.OAuthAs(login)
	next := "/ci/login/github"
	for range 10 {
		code, _, loc := c.send(http.MethodGet, next, nil)
		if code/100 != 3 || loc == "" {
			break
		}
		next = loc
	}
	if _, body := c.get("/ci/"); !strings.Contains(body, login+"@github") {
		c.fx.t.Fatalf("login as %s failed:\n%s", login, body)
	}
	return c
}

// probe is one request to a route: its path with the private project's values in it.
type probe struct{ method, path string }

// probes are the requests that reach pattern's route with the private project's data, each
// with its twin that asks for a project, evaluation or build that does not exist.
func (fx *visFixture) probes(pattern string) (hidden, missing []probe) {
	hidden = fx.probesOf(pattern, hushProject, fmt.Sprint(fx.evalID), fmt.Sprint(fx.jobID))
	missing = fx.probesOf(pattern, missingProject, missingID, missingID)
	return hidden, missing
}

// The twins' names: no such project, evaluation or build.
const (
	missingProject = "nope-zz"
	missingID      = "999999"
)

func (fx *visFixture) probesOf(pattern, project, evalID, jobID string) []probe {
	method, path, _ := strings.Cut(pattern, " ")
	path = strings.TrimSuffix(path, "{$}")
	var id string
	switch {
	case strings.Contains(path, "/api/evals/"), strings.Contains(path, "/api/events/eval/"), strings.Contains(path, "/api/v1/evaluations/"):
		id = evalID
	case strings.Contains(path, "/api/nodes/"):
		id = "vis"
	default:
		id = jobID
	}
	r := strings.NewReplacer("{id}", id, "{project}", project, "{repo_id}", fmt.Sprint(fx.hushRepo),
		"{forge}", "github", "{repo}", "1", "{key...}", "nar/x.nar", "{name}", "x.narinfo", "{file}", "x.nar", "{drv}", "x.drv")
	if strings.Contains(path, "{rest...}") {
		base := strings.ReplaceAll(r.Replace(path), "{rest...}", "")
		return []probe{{method, base}, {method, base + "eval/" + evalID}, {method, base + "build/" + jobID},
			{method, "/ci/app/build/" + jobID}} // the private build under a public project
	}
	return []probe{{method, r.Replace(path)}}
}

// idIn is the last number in path ("" if none): the evaluation or build a probe asks for.
func idIn(path string) string {
	all := regexp.MustCompile(`\d+`).FindAllString(path, -1)
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1]
}

// leaks reports which of the private project's markers body holds.
func leaks(body string) []string {
	var out []string
	for _, m := range []string{hushProject, hushAttr, hushLog, urlToken} {
		if strings.Contains(body, m) {
			out = append(out, m)
		}
	}
	return out
}

// TestEveryRouteCarriesItsDeclaration enumerates every route of a node with every HTTP role,
// holds each to its declaration, and asks each, anonymously, for a private project's data:
// the checked routes answer 404 (as for something that does not exist), the admins' and the
// signed routes refuse, and the others show nothing of it. A reader's session then gets it.
func TestEveryRouteCarriesItsDeclaration(t *testing.T) {
	t.Parallel()
	fx := newVisFixture(t)
	var patterns []string
	for _, r := range fx.routes.List() {
		patterns = append(patterns, r.Pattern)
		want, ok := declared[r.Pattern]
		switch {
		case !ok:
			t.Errorf("route %s (%s) is not in the test's list: say what it carries", r.Pattern, r.Scope.Kind)
			continue
		case r.Scope.Kind != want:
			t.Errorf("route %s is declared %s, want %s", r.Pattern, r.Scope.Kind, want)
			continue
		}
		anon := fx.client()
		hidden, missing := fx.probes(r.Pattern)
		for i, p := range hidden {
			code, body := anon.do(p.method, p.path, nil)
			switch r.Scope.Kind {
			case access.KindProject, access.KindEval, access.KindJob:
				// The answer is the one for what does not exist, the name asked for
				// echoed and nothing more.
				mcode, mbody := anon.do(missing[i].method, missing[i].path, nil)
				mbody = strings.NewReplacer(missingProject, hushProject, missingID, idIn(p.path)).Replace(mbody)
				if code != http.StatusNotFound || code != mcode || body != mbody {
					t.Errorf("%s %s anonymously: %d, want the 404 of %s (%d):\n%s\n--- vs ---\n%s", p.method, p.path, code,
						missing[i].path, mcode, body, mbody)
				}
				body = strings.ReplaceAll(body, hushProject, "") // echoed from the URL
			}
			if l := leaks(body); len(l) > 0 {
				t.Errorf("%s %s anonymously (%s): %d, body holds %v", p.method, p.path, r.Scope.Kind, code, l)
			}
			switch r.Scope.Kind {
			case access.KindAdmin, access.KindSigned:
				if code/100 == 2 {
					t.Errorf("%s %s anonymously: %d, want a refusal", p.method, p.path, code)
				}
			}
		}
	}
	for p := range declared {
		if !slices.Contains(patterns, p) {
			t.Errorf("the test lists %s, which the node no longer serves", p)
		}
	}

	// Without the check, a 404 would name something: the live log of a build that does not
	// exist answers the same.
	anon := fx.client()
	_, missing := anon.get("/api/builds/999999/log")
	_, hidden := anon.get(fmt.Sprintf("/api/builds/%d/log", fx.jobID))
	if strings.ReplaceAll(hidden, fmt.Sprint(fx.jobID), "N") != strings.ReplaceAll(missing, "999999", "N") {
		t.Errorf("a private build's log %q differs from a missing one's %q", hidden, missing)
	}

	// A reader (read access on the forge), and the admin token, get it all; a logged-in
	// stranger does not.
	friend := fx.client().login("friend")
	admin := fx.client()
	admin.bearer = adminToken
	stranger := fx.client().login("stranger")
	for _, path := range []string{
		"/ci/" + hushProject + "/",
		fmt.Sprintf("/ci/%s/eval/%d", hushProject, fx.evalID),
		fmt.Sprintf("/ci/%s/build/%d", hushProject, fx.jobID),
		fmt.Sprintf("/api/events/eval/%d", fx.evalID),
		"/api/v1/projects/" + hushProject,
		"/api/v1/projects/" + hushProject + "/evaluations",
		fmt.Sprintf("/api/v1/evaluations/%d", fx.evalID),
		fmt.Sprintf("/api/v1/evaluations/%d/failures", fx.evalID),
		fmt.Sprintf("/api/v1/builds/%d", fx.jobID),
	} {
		for name, c := range map[string]*client{"reader": friend, "admin token": admin} {
			if code, body := c.get(path); code != http.StatusOK {
				t.Errorf("GET %s as the %s: %d, want 200:\n%.300s", path, name, code, body)
			}
		}
		if code, _ := stranger.get(path); code != http.StatusNotFound {
			t.Errorf("GET %s as a stranger: %d, want 404", path, code)
		}
	}
	logPath := fmt.Sprintf("/api/builds/%d/log", fx.jobID)
	for name, c := range map[string]*client{"reader": friend, "admin token": admin} {
		code, body := c.do(http.MethodGet, logPath, map[string]string{"Accept": "text/event-stream"})
		if code != http.StatusOK || !strings.Contains(body, hushLog) {
			t.Errorf("live log as the %s: %d, want 200 with the log:\n%s", name, code, body)
		}
	}
	for _, path := range []string{"/ci/", "/api/v1/projects", "/api/v1/queue"} {
		if _, body := friend.get(path); !strings.Contains(body, hushProject) {
			t.Errorf("the reader's %s does not list the private project", path)
		}
	}
	// Reading is not acting: the reader may not rebuild (403, not 404: they know it exists).
	if code, _ := friend.do(http.MethodPost, fmt.Sprintf("/api/builds/%d/rebuild", fx.jobID), nil); code != http.StatusForbidden && code != http.StatusUnauthorized {
		t.Errorf("the reader's rebuild: %d, want a refusal", code)
	}
}

// /metrics names no private or disabled project, whoever asks; /api/cluster shows anonymous
// callers nodes without their endpoints, hostnames and versions, and the admin token all.
func TestMetricsAndClusterRedacted(t *testing.T) {
	t.Parallel()
	fx := newVisFixture(t)
	anon, admin := fx.client(), fx.client()
	admin.bearer = adminToken
	for _, c := range []*client{anon, admin} {
		code, body := c.get("/metrics")
		if code != http.StatusOK || strings.Contains(body, hushProject) {
			t.Errorf("/metrics: %d, holds the private project's name: %v", code, strings.Contains(body, hushProject))
		}
		if !regexp.MustCompile(`harmonia_ci_project_consumed_seconds\{project="#\d+"\} `).MatchString(body) {
			t.Errorf("/metrics lacks the private project by id")
		}
	}
	decode := func(c *client) []map[string]any {
		code, body := c.get("/api/cluster")
		var st struct{ Nodes []map[string]any }
		if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || len(st.Nodes) == 0 {
			t.Fatalf("/api/cluster: %d %s", code, body)
		}
		return st.Nodes
	}
	for _, n := range decode(anon) {
		for _, k := range []string{"endpoint", "hostname", "version", "incarnation", "nix_version"} {
			if _, ok := n[k]; ok {
				t.Errorf("/api/cluster anonymously shows %s: %v", k, n)
			}
		}
	}
	for _, n := range decode(admin) {
		if n["endpoint"] == nil || n["version"] != "test" {
			t.Errorf("/api/cluster with the admin token lacks the endpoint or version: %v", n)
		}
	}
	// The API's nodes show anonymous callers the same: those fields are there, and empty.
	for _, tc := range []struct {
		c      *client
		fields []string // empty for anonymous callers, set for the admin
		public bool
	}{{anon, []string{"endpoint", "hostname", "version", "nix_version"}, true}, {admin, []string{"endpoint", "version"}, false}} {
		code, body := tc.c.get("/api/v1/nodes")
		var st struct{ Nodes []map[string]any }
		if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil || len(st.Nodes) == 0 {
			t.Fatalf("/api/v1/nodes: %d %s", code, body)
		}
		for _, n := range st.Nodes {
			for _, k := range tc.fields {
				if empty := n[k] == ""; empty != tc.public {
					t.Errorf("/api/v1/nodes (anonymous %v) shows %s = %v", tc.public, k, n[k])
				}
			}
		}
	}
}

// A clone URL with a credential recorded before they were refused is shown redacted on every
// page and in the API.
func TestCloneURLRedacted(t *testing.T) {
	t.Parallel()
	fx := newVisFixture(t)
	anon, admin := fx.client(), fx.client()
	admin.bearer = adminToken
	for _, tc := range []struct {
		c    *client
		path string
	}{{anon, "/ci/"}, {anon, "/ci/byurl/"}, {admin, "/api/repositories"}, {anon, "/api/v1/projects"}, {anon, "/api/v1/projects/byurl"}} {
		code, body := tc.c.get(tc.path)
		if code != http.StatusOK || strings.Contains(body, urlToken) || !strings.Contains(body, "REDACTED@git.example") {
			t.Errorf("GET %s: %d; want the URL redacted:\n%.2000s", tc.path, code, body)
		}
	}
}

// The admin marks a project added by URL private through the API: from then on it is hidden
// like a private forge repository's. A forge's repository is private as its forge says.
func TestMarkProjectByURLPrivate(t *testing.T) {
	t.Parallel()
	fx := newVisFixture(t)
	anon, admin := fx.client(), fx.client()
	admin.bearer = adminToken
	if code, _ := anon.get("/ci/byurl/"); code != http.StatusOK {
		t.Fatalf("public project added by URL: %d", code)
	}
	if code := anon.postJSON(fmt.Sprintf("/api/projects/%d/settings", fx.byURLRepo), `{"private": true}`); code != http.StatusUnauthorized {
		t.Errorf("anonymous settings: %d, want 401", code)
	}
	if code := admin.postJSON(fmt.Sprintf("/api/projects/%d/settings", fx.byURLRepo), `{"private": true}`); code != http.StatusOK {
		t.Fatalf("marking it private: %d", code)
	}
	if code, _ := anon.get("/ci/byurl/"); code != http.StatusNotFound {
		t.Errorf("private project added by URL, anonymously: %d, want 404", code)
	}
	if code, _ := admin.get("/ci/byurl/"); code != http.StatusOK {
		t.Errorf("private project added by URL, admin token: %d, want 200", code)
	}
	if code := admin.postJSON(fmt.Sprintf("/api/projects/%d/settings", fx.hushRepo), `{"private": false}`); code != http.StatusConflict {
		t.Errorf("marking a forge's repository public: %d, want 409", code)
	}
}
