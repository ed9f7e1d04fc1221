package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

const (
	giteaWebhookSecret = "e2e-gitea-webhook-secret"
	ctxEval            = "harmonia-ci/nix-eval"
	ctxBuild           = "harmonia-ci/nix-build"
)

// forgeCluster is a build cluster whose frontends are connected to a real Gitea, and a
// repository there whose owner's token the CI uses.
type forgeCluster struct {
	*buildCluster
	gitea *giteatest.Server
	owner giteatest.User
	repo  giteatest.Repo
	// repoID is the repository's row, once discovered; forgeID is Gitea's id of it.
	repoID  int64
	forgeID int64
}

type forgeOptions struct {
	builders int
	// private makes the repository private.
	private bool
	// publicURL is [frontend] public_url; "" leaves the default (the node's endpoint).
	publicURL string
	// frontendLines are more [frontend] lines.
	frontendLines string
	// repoSync is [frontend] repo_sync_interval; "" is 1s.
	repoSync string
	// sandboxPaths are more [build] extra_sandbox_paths than /bin/sleep.
	sandboxPaths []string
	// prepare runs once the Gitea user exists, before the cluster starts: it may create more
	// repositories and return lines for the [[forges]] entry and the frontends' environment.
	prepare func(g *giteatest.Server, owner giteatest.User) (forgeLines string, env []string)
}

// newForgeCluster creates a Gitea user and repository with a first commit on main, then
// starts the cluster (front-1 runs frontend, signer and cache) with the Gitea forge
// configured, and waits until the repository is discovered.
func newForgeCluster(t *testing.T, o forgeOptions) *forgeCluster {
	t.Helper()
	g := giteatest.Shared(t)
	ctx := context.Background()
	owner, err := g.CreateUser(ctx, giteatest.UniqueName("alice"))
	if err != nil {
		t.Fatal(err)
	}
	repo, err := g.CreateRepo(ctx, owner, giteatest.UniqueName("hello"), o.private)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Push(ctx, repo, owner, "main", map[string]string{"README": "hello\n"}, "init", false); err != nil {
		t.Fatal(err)
	}
	extra := fmt.Sprintf("[frontend]\nstatus_debounce = \"100ms\"\nrepo_sync_interval = %q\npoll_check_interval = \"1s\"\n", cmp.Or(o.repoSync, "1s"))
	if o.publicURL != "" {
		extra += fmt.Sprintf("public_url = %q\n", o.publicURL)
	}
	extra += o.frontendLines
	extra += fmt.Sprintf("[[forges]]\nname = \"gitea\"\ntype = \"gitea\"\nurl = %q\n", g.URL)
	env := []string{
		"HARMONIA_FORGE_GITEA_TOKEN=" + owner.Token,
		"HARMONIA_FORGE_GITEA_WEBHOOK_SECRET=" + giteaWebhookSecret,
		"HARMONIA_ADMIN_TOKEN=" + adminToken,
	}
	if o.prepare != nil {
		lines, more := o.prepare(g, owner)
		extra += lines
		env = append(env, more...)
	}
	c := &forgeCluster{
		buildCluster: newBuildCluster(t, buildClusterOptions{builders: max(o.builders, 1), extraConfig: extra, frontendEnv: env,
			sandboxPaths: append([]string{"/bin/sleep"}, o.sandboxPaths...)}),
		gitea: g, owner: owner, repo: repo,
	}
	proctest.WaitFor(t, 30*time.Second, "repository "+repo.FullName()+" discovered", func() bool {
		c.checkRunning()
		err := c.pool.QueryRow(ctx, `SELECT id, forge_id FROM repositories WHERE forge = 'gitea' AND full_name = $1 AND forge_id IS NOT NULL`,
			repo.FullName()).Scan(&c.repoID, &c.forgeID)
		return err == nil
	})
	return c
}

// admin calls the admin API of node id.
func (c *forgeCluster) admin(id, method, path string, body any) (int, string) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.endpoint(id)+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	return sendRequest(c.t, req)
}

func (c *forgeCluster) enable(settings map[string]any) {
	c.t.Helper()
	if code, out := c.admin("front-1", http.MethodPost, fmt.Sprintf("/api/projects/%d/enable", c.repoID), settings); code != http.StatusOK {
		c.t.Fatalf("enable: %d %s", code, out)
	}
}

// push commits files to branch of the repository as user.
func (c *forgeCluster) push(user giteatest.User, repo giteatest.Repo, branch string, files map[string]string, force bool) string {
	c.t.Helper()
	sha, err := c.gitea.Push(context.Background(), repo, user, branch, files, "change", force)
	if err != nil {
		c.t.Fatal(err)
	}
	return sha
}

// statuses lists every status Gitea has for sha, oldest first.
func (c *forgeCluster) statuses(sha string) []giteatest.Status {
	c.t.Helper()
	ss, err := c.gitea.Statuses(context.Background(), c.repo, sha)
	if err != nil {
		c.t.Fatal(err)
	}
	slices.SortFunc(ss, func(a, b giteatest.Status) int { return int(a.ID - b.ID) })
	return ss
}

// latest is the newest status of context in ss, or a zero Status.
func latest(ss []giteatest.Status, context string) giteatest.Status {
	var l giteatest.Status
	for _, s := range ss {
		if s.Context == context && s.ID > l.ID {
			l = s
		}
	}
	return l
}

// waitStatuses waits until sha's newest nix-eval and nix-build statuses have the given states
// ("" for build: no nix-build status at all) and returns every status of the commit.
func (c *forgeCluster) waitStatuses(sha, evalState, buildState string, timeout time.Duration) []giteatest.Status {
	c.t.Helper()
	var ss []giteatest.Status
	deadline := time.Now().Add(timeout)
	for {
		c.checkRunning()
		ss = c.statuses(sha)
		e, b := latest(ss, ctxEval), latest(ss, ctxBuild)
		if e.State == evalState && b.State == buildState {
			return ss
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("statuses of %s after %s: want nix-eval %q, nix-build %q; have:\n%s\nfront-1:\n%s",
				sha[:12], timeout, evalState, buildState, formatStatuses(ss), lastLines(c.procs["front-1"].Logs(), 40))
		}
		time.Sleep(100 * time.Millisecond) // polling Gitea's API, not synchronisation
	}
}

func formatStatuses(ss []giteatest.Status) string {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "  #%d %s %s %q %s\n", s.ID, s.Context, s.State, s.Description, s.TargetURL)
	}
	return b.String()
}

// checkOnce fails for any status Gitea received twice (same context, state and description).
func checkOnce(t *testing.T, ss []giteatest.Status) {
	t.Helper()
	seen := map[string]int{}
	for _, s := range ss {
		seen[s.Context+" "+s.State+" "+s.Description]++
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("status %q reached Gitea %d times, want once; all:\n%s", k, n, formatStatuses(ss))
		}
	}
}

// evalOf returns the evaluation of commit sha on branch, waiting for it to exist.
func (c *forgeCluster) evalOf(sha, branch string) (id int64, st status.EvalStatus) {
	c.t.Helper()
	proctest.WaitFor(c.t, 30*time.Second, "evaluation of "+sha[:12]+" on "+branch, func() bool {
		err := c.pool.QueryRow(context.Background(), `SELECT id, status FROM evaluations WHERE commit_sha = $1 AND branch = $2`,
			sha, branch).Scan(&id, &st)
		return err == nil
	})
	return id, st
}

func (c *forgeCluster) evaluations(sha string) int {
	c.t.Helper()
	var n int
	if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM evaluations WHERE commit_sha = $1`, sha).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// waitLog waits until node id has logged want n times in all.
func (c *forgeCluster) waitLog(id, want string, n int) {
	c.t.Helper()
	proctest.WaitFor(c.t, 30*time.Second, fmt.Sprintf("%s logging %q %d times", id, want, n), func() bool {
		return strings.Count(c.procs[id].Logs(), want) >= n
	})
}

// deliver posts a push delivery in Gitea's format for commit sha of the repository to node
// id's webhook endpoint for it, signed with the repository's secret under the forge secret
// secret ("" leaves the signature out).
func (c *forgeCluster) deliver(id, sha, secret string) (int, string) {
	c.t.Helper()
	body := giteaPushBody(c.t, c.repo, c.forgeID, sha)
	var sig []byte
	if secret != "" {
		sig = forge.RepositorySecret([]byte(secret), c.forgeID)
	}
	return c.deliverBody(id, fmt.Sprintf("/webhook/gitea/%d", c.forgeID), fmt.Sprintf("e2e-%d", time.Now().UnixNano()), sig, body)
}

// giteaPushBody is a push delivery in Gitea's format of commit sha to repo's main, whose
// Gitea id is forgeID.
func giteaPushBody(t *testing.T, repo giteatest.Repo, forgeID int64, sha string) []byte {
	t.Helper()
	body, err := os.ReadFile("../internal/giteatest/testdata/push.json")
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatal(err)
	}
	p["after"] = sha
	r := p["repository"].(map[string]any)
	r["id"], r["full_name"], r["name"], r["clone_url"] = forgeID, repo.FullName(), repo.Name, repo.CloneURL
	r["owner"] = map[string]any{"login": repo.Owner}
	body, _ = json.Marshal(p)
	return body
}

// deliverBody posts a Gitea push delivery of body to path on node id, signed with secret
// (nil leaves the signature out).
func (c *forgeCluster) deliverBody(id, path, delivery string, secret, body []byte) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.endpoint(id)+path, bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Gitea-Event", "push")
	req.Header.Set("X-Gitea-Delivery", delivery)
	if secret != nil {
		req.Header.Set("X-Gitea-Signature", forge.Sign(secret, body))
	}
	return sendRequest(c.t, req)
}

// okNix is a project of one derivation that succeeds; failNix adds one that fails.
func okNix(salt string) string {
	return shLib(salt) + ` { ok = sh "ok" [] "echo ok"; }`
}

func failNix(salt string) string {
	return shLib(salt) + ` { ok = sh "ok" [] "echo ok"; broken = sh "broken" [] "echo failing on purpose >&2; exit 3"; }`
}

// slowNix takes half a minute to evaluate (and is cancelled long before).
func slowNix(salt string) string {
	return shLib(salt) + ` let
  spin = i: builtins.foldl' (a: b: a + b) 0 (builtins.genList (x: x + i) 3000000);
  slow = builtins.foldl' (acc: i: builtins.seq (spin i) acc) 0 (builtins.genList (x: x) 10);
in builtins.seq slow { ok = sh "slow-ok" [] "echo ok"; }`
}

// A push to a Gitea repository's default branch runs through evaluation and builds to
// commit statuses; a failure links to its build; a force-push supersedes the running
// evaluation; pull requests from strangers wait for a collaborator's "/ci run"; forged
// deliveries are refused; disabling removes the webhook.
func TestGiteaPushToCommitStatuses(t *testing.T) {
	c := newForgeCluster(t, forgeOptions{})
	ctx := context.Background()
	salt := uniqueSalt(t)

	// Enabling registers the webhook to the frontend.
	c.enable(nil)
	hooks, err := c.gitea.Hooks(ctx, c.repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(hooks) != 1 || hooks[0].Config["url"] != fmt.Sprintf("%s/webhook/gitea/%d", c.endpoint("front-1"), c.forgeID) || !hooks[0].Active {
		t.Fatalf("hooks after enable: %+v", hooks)
	}
	c.enable(nil) // idempotent: still one hook
	if hooks, _ := c.gitea.Hooks(ctx, c.repo); len(hooks) != 1 {
		t.Fatalf("hooks after a second enable: %+v", hooks)
	}

	// A push → evaluation → build → nix-eval and nix-build go pending → success.
	a := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": okNix(salt)}, false)
	ss := c.waitStatuses(a, "success", "success", 2*time.Minute)
	checkOnce(t, ss)
	for _, ctxName := range []string{ctxEval, ctxBuild} {
		var states []string
		for _, s := range ss {
			if s.Context == ctxName {
				states = append(states, s.State)
			}
		}
		if len(states) < 2 || states[0] != "pending" || states[len(states)-1] != "success" {
			t.Errorf("%s went %v, want pending … success", ctxName, states)
		}
	}
	evalID, _ := c.evalOf(a, "main")
	if b := latest(ss, ctxBuild); b.Description != "1/1 builds complete" || !strings.HasSuffix(b.TargetURL, fmt.Sprintf("/ci/%s/eval/%d", c.repo.Name, evalID)) {
		t.Errorf("nix-build: %+v", b)
	}

	// A failing derivation: nix-build failure, linking to the failed build, and saying the
	// attribute is new and failing against the commit before.
	b := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": failNix(salt)}, false)
	ss = c.waitStatuses(b, "success", "failure", 2*time.Minute)
	checkOnce(t, ss)
	if f := latest(ss, ctxBuild); f.Description != "1/2 builds failed (1 newly failing)" || !strings.Contains(f.TargetURL, "/ci/"+c.repo.Name+"/build/") {
		t.Errorf("nix-build failure: %+v", f)
	}

	// A force-push while the evaluation runs supersedes it: its nix-eval becomes error.
	slow := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": slowNix(salt)}, false)
	slowID, _ := c.evalOf(slow, "main")
	proctest.WaitFor(t, 60*time.Second, "the slow evaluation running", func() bool {
		var st status.EvalStatus
		_ = c.pool.QueryRow(ctx, `SELECT status FROM evaluations WHERE id = $1`, slowID).Scan(&st)
		return st == status.EvalRunning
	})
	amended := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": okNix(salt + "-amended")}, true)
	ss = c.waitStatuses(slow, "error", "", time.Minute)
	checkOnce(t, ss)
	if e := latest(ss, ctxEval); e.Description != "superseded by a newer commit" {
		t.Errorf("superseded nix-eval: %+v", e)
	}
	checkOnce(t, c.waitStatuses(amended, "success", "success", 2*time.Minute))

	// A pull request from a stranger's fork is not evaluated...
	bob, err := c.gitea.CreateUser(ctx, giteatest.UniqueName("bob"))
	if err != nil {
		t.Fatal(err)
	}
	fork, err := c.gitea.Fork(ctx, c.repo, bob)
	if err != nil {
		t.Fatal(err)
	}
	// The pull request's branch shares main's history, as a real one does: it is evaluated
	// merged into main.
	if err := c.gitea.CreateBranch(ctx, fork, bob, "feature", "main"); err != nil {
		t.Fatal(err)
	}
	prHead := c.push(bob, fork, "feature", map[string]string{"ci.nix": okNix(salt + "-pr")}, false)
	pr, err := c.gitea.CreatePullRequest(ctx, bob, c.repo, "main", fork, "feature", "a change")
	if err != nil {
		t.Fatal(err)
	}
	waiting := fmt.Sprintf("pull request #%d by %s waits for a collaborator", pr, bob.Login)
	c.waitLog("front-1", waiting, 1)
	if n := c.evaluations(prHead); n != 0 {
		t.Fatalf("%d evaluations of a stranger's pull request before approval", n)
	}
	// ...nor on its author's own "/ci run"...
	if err := c.gitea.Comment(ctx, c.repo, bob, pr, "/ci run"); err != nil {
		t.Fatal(err)
	}
	c.waitLog("front-1", fmt.Sprintf("\\\"/ci run\\\" by %s ignored: not a collaborator", bob.Login), 1)
	// ...until a collaborator comments "/ci run": then its head as of the comment is.
	if err := c.gitea.Comment(ctx, c.repo, c.owner, pr, "Looks fine.\n/ci run\n"); err != nil {
		t.Fatal(err)
	}
	prEval, _ := c.evalOf(prHead, fmt.Sprintf("pull/%d", pr))
	checkOnce(t, c.waitStatuses(prHead, "success", "success", 2*time.Minute))
	var prAuthor string
	var prAuthorID int64
	if err := c.pool.QueryRow(ctx, `SELECT pr_author, COALESCE(pr_author_id, 0) FROM evaluations WHERE id = $1`, prEval).Scan(&prAuthor, &prAuthorID); err != nil ||
		prAuthor != bob.Login || prAuthorID != bob.ID {
		t.Errorf("pull request evaluation's author %q, id %d (%v), want %s, id %d", prAuthor, prAuthorID, err, bob.Login, bob.ID)
	}
	// A later push to the pull request needs a new approval.
	newHead := c.push(bob, fork, "feature", map[string]string{"ci.nix": okNix(salt + "-pr2")}, false)
	c.waitLog("front-1", waiting, 2)
	if n := c.evaluations(newHead); n != 0 {
		t.Fatalf("a push after the approval was evaluated without a new one (%d evaluations)", n)
	}

	// Forged and unsigned deliveries are refused before anything is recorded.
	forged := strings.Repeat("f", 40)
	for _, secret := range []string{"not-the-secret", ""} {
		if code, out := c.deliver("front-1", forged, secret); code != http.StatusUnauthorized {
			t.Errorf("delivery signed with %q: %d %s, want 401", secret, code, out)
		}
	}
	if n := c.evaluations(forged); n != 0 {
		t.Fatalf("a forged delivery made %d evaluations", n)
	}
	var deliveries int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id LIKE 'e2e-%'`).Scan(&deliveries); err != nil || deliveries != 0 {
		t.Fatalf("forged deliveries recorded: %d (%v)", deliveries, err)
	}

	// Polling: with the webhook gone (a forge that cannot reach the CI), a project with a
	// poll_interval still has new heads of its default branch evaluated.
	hooks, err = c.gitea.Hooks(ctx, c.repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		if err := c.gitea.Do(ctx, c.owner.Token, http.MethodDelete, fmt.Sprintf("/repos/%s/hooks/%d", c.repo.FullName(), h.ID), nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if code, out := c.admin("front-1", http.MethodPost, fmt.Sprintf("/api/projects/%d/settings", c.repoID), map[string]any{"poll_interval": "1m"}); code != http.StatusOK {
		t.Fatalf("settings: %d %s", code, out)
	}
	polled := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": okNix(salt + "-polled")}, false)
	// Due now rather than in a minute: the leader checks every poll_check_interval (1s).
	if _, err := c.pool.Exec(ctx, `UPDATE projects SET last_polled = now() - interval '1 hour' WHERE repo_id = $1`, c.repoID); err != nil {
		t.Fatal(err)
	}
	checkOnce(t, c.waitStatuses(polled, "success", "success", 2*time.Minute))

	// Disabling removes the webhook; a genuine delivery for the disabled project is answered
	// 200 without an evaluation.
	if code, out := c.admin("front-1", http.MethodPost, fmt.Sprintf("/api/projects/%d/disable", c.repoID), nil); code != http.StatusOK {
		t.Fatalf("disable: %d %s", code, out)
	}
	if hooks, err := c.gitea.Hooks(ctx, c.repo); err != nil || len(hooks) != 0 {
		t.Fatalf("hooks after disable: %+v (%v)", hooks, err)
	}
	if code, out := c.deliver("front-1", forged, giteaWebhookSecret); code != http.StatusOK || !strings.Contains(out, "disabled") {
		t.Errorf("delivery for a disabled project: %d %s, want 200 …disabled", code, out)
	}
	if n := c.evaluations(forged); n != 0 {
		t.Fatalf("a disabled project was evaluated (%d evaluations)", n)
	}
}

// roundRobin is a load balancer in front of the frontends: each request goes to the next
// backend that accepts a connection.
type roundRobin struct {
	mu       sync.Mutex
	backends []string
	next     int
	client   *http.Client
}

// startRoundRobin serves a roundRobin (whose client has timeout, 0 for none: event streams
// last as long as their page) on a loopback port until the test ends, and returns it with its
// URL.
func startRoundRobin(t *testing.T, timeout time.Duration) (*roundRobin, string) {
	t.Helper()
	lb := &roundRobin{client: &http.Client{Timeout: timeout}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: lb, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return lb, "http://" + ln.Addr().String()
}

// giteaOAuthApp registers an OAuth2 application on g, as the user with token, whose redirect
// URI is public's callback, and returns its client id and secret.
func giteaOAuthApp(t *testing.T, g *giteatest.Server, token, public string) (id, secret string) {
	t.Helper()
	var app struct {
		ClientID     string `json:"client_id"`
		ClientSecret string `json:"client_secret"`
	}
	if err := g.Do(context.Background(), token, http.MethodPost, "/user/applications/oauth2", map[string]any{
		"name": giteatest.UniqueName("harmonia-ci"), "confidential_client": true,
		"redirect_uris": []string{public + "/ci/oauth/gitea/callback"},
	}, &app); err != nil {
		t.Fatal(err)
	}
	return app.ClientID, app.ClientSecret
}

// oauthLines are the configuration lines and environment of a frontend logging in through
// the Gitea OAuth application id with secret.
func oauthLines(id, secret string) (string, []string) {
	return fmt.Sprintf("oauth_client_id = %q\n", id), []string{
		"HARMONIA_FORGE_GITEA_OAUTH_SECRET=" + secret,
		"HARMONIA_AUTH_SECRET=" + strings.Repeat("e2e-cookie-secret-", 3),
	}
}

func (p *roundRobin) set(backends ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backends = backends
}

func (p *roundRobin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	backends, start := slices.Clone(p.backends), p.next
	p.next++
	p.mu.Unlock()
	for i := range backends {
		b := backends[(start+i)%len(backends)]
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, b+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header = r.Header.Clone()
		client := *p.client
		client.CheckRedirect = func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // redirects are the browser's to follow
		}
		resp, err := client.Do(req)
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			continue // a dead frontend: the next one
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		// Pass every chunk on at once, as a balancer in front of event streams must: buffered,
		// a live update would wait for the next 4 KB.
		fl, _ := w.(http.Flusher)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil {
					break
				}
				if fl != nil {
					fl.Flush()
				}
			}
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		return
	}
	http.Error(w, "no frontend", http.StatusBadGateway)
}

// Three frontends behind one load balancer receive the same webhook deliveries and the same
// notifications: every status transition reaches Gitea exactly once, also when one of them
// is killed with SIGKILL while builds finish.
func TestGiteaStatusesOnceAcrossFrontends(t *testing.T) {
	lb, public := startRoundRobin(t, 30*time.Second)

	c := newForgeCluster(t, forgeOptions{builders: 2, publicURL: public})
	for _, id := range []string{"front-2", "front-3"} {
		c.startNode(id, "frontend")
		c.waitActive(id)
	}
	lb.set(c.endpoint("front-1"), c.endpoint("front-2"), c.endpoint("front-3"))
	c.enable(nil)
	// The maintenance leader's discovery may register the hook again meanwhile (a hook of
	// another address or secret): wait for the one hook to the balancer.
	proctest.WaitFor(t, 30*time.Second, "one hook to the balancer", func() bool {
		hooks, err := c.gitea.Hooks(context.Background(), c.repo)
		return err == nil && len(hooks) == 1 && hooks[0].Config["url"] == fmt.Sprintf("%s/webhook/gitea/%d", public, c.forgeID)
	})

	// Builds that take a while, so statuses move through several pending descriptions.
	salt := uniqueSalt(t)
	var attrs []string
	for i := range 6 {
		attrs = append(attrs, fmt.Sprintf(`p%d = sh "p%d" [] "/bin/sleep %d";`, i, i, 1+i%3))
	}
	expr := shLib(salt) + " { " + strings.Join(attrs, " ") + " }"
	first := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": expr}, false)
	// Once builds are under way, kill one frontend.
	proctest.WaitFor(t, 2*time.Minute, "the first build finished", func() bool {
		c.checkRunning()
		var n int
		_ = c.pool.QueryRow(context.Background(), `SELECT count(*) FROM build_jobs j JOIN eval_attrs a USING (drv_path)
JOIN evaluations e ON e.id = a.eval_id WHERE e.commit_sha = $1 AND j.status = 'succeeded'`, first).Scan(&n)
		return n >= 1
	})
	c.kill9("front-2")
	ss := c.waitStatuses(first, "success", "success", 3*time.Minute)
	checkOnce(t, ss)
	if d := latest(ss, ctxBuild).Description; d != "6/6 builds complete" {
		t.Errorf("final nix-build description %q", d)
	}

	// The two that are left go on: a second push, delivered through the balancer.
	second := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": okNix(salt + "-2")}, false)
	checkOnce(t, c.waitStatuses(second, "success", "success", 2*time.Minute))
	checkOnce(t, c.statuses(first)) // nothing more arrived for the first commit

	var reporters []string
	for _, id := range []string{"front-1", "front-2", "front-3"} {
		if n := strings.Count(c.procs[id].Logs(), "commit status reported"); n > 0 {
			reporters = append(reporters, id+"="+strconv.Itoa(n))
		}
	}
	t.Logf("status calls per frontend: %v", reporters)
	var pending int
	if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM evaluations WHERE reported_status IS DISTINCT FROM last_status`).Scan(&pending); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	if pending != 0 {
		t.Errorf("%d evaluations still have undelivered statuses", pending)
	}
}
