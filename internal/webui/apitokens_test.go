package webui

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/apitoken"
	"github.com/harmonia-ci/harmonia-ci/internal/apiv1"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

var mintedAPIRE = regexp.MustCompile(`id="minted-api-token">(hci_[A-Za-z0-9_-]+)<`)

// withAPI serves the UI and the read API on one mux (as a frontend node does) in place of the
// fixture's UI-only server.
func (fx *authFixture) withAPI() {
	mux := http.NewServeMux()
	rt := access.NewRoutes(mux, nil)
	fx.u.Register(rt)
	apiv1.New(apiv1.Config{Pool: fx.pool}).Register(rt)
	fx.srv.Close()
	fx.srv = httptest.NewServer(mux)
	fx.t.Cleanup(fx.srv.Close)
}

// mintAPI mints a personal API token as b through the tokens page's form and returns it.
func (b *browser) mintAPI(name string) string {
	b.fx.t.Helper()
	resp, body := b.post("/ci/tokens/api", url.Values{"csrf": {b.csrf()}, "name": {name}, "days": {"30"}}, acceptHTML)
	m := mintedAPIRE.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		b.fx.t.Fatalf("mint an API token: %d, no token on the page:\n%s", resp.StatusCode, body)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		b.fx.t.Errorf("the page showing a token: Cache-Control %q, want no-store", cc)
	}
	return m[1]
}

// bearer sends a request with token as its bearer token and no cookie, and returns the status
// and body.
func (fx *authFixture) bearer(method, path, token string) (int, string, http.Header) {
	fx.t.Helper()
	req, err := http.NewRequestWithContext(fx.ctx, method, fx.srv.URL+path, nil)
	if err != nil {
		fx.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fx.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), resp.Header
}

func apiTokenID(t *testing.T, body, name string) int64 {
	t.Helper()
	m := regexp.MustCompile(`<tr id="api-token-(\d+)">\s*<td>#\d+</td>(?:<td>[^<]*</td>)?\s*<td>` + regexp.QuoteMeta(name) + `</td>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no API token %q listed:\n%s", name, body)
	}
	var id int64
	fmt.Sscan(m[1], &id)
	return id
}

// A personal API token is its user: minted on /ci/tokens (shown once, stored hashed), it reads
// what they may read on the pages and the API and acts where they may (no CSRF token: a bearer
// token is not ambient), every action recorded with the token; revoked or expired, it is
// refused with a 401 at once. Cache tokens and API tokens are not each other.
func TestAPITokens(t *testing.T) {
	fx := newAuthFixture(t)
	fx.withAPI()
	secret := fx.project("secret", "github", "octo/secret", true)
	app := fx.project("app", "github", "octo/app", false)
	secretJob, drv := fx.job(secret, 0, status.JobFailed)
	appEval := fx.eval(app, status.EvalFailed, 0, "")
	appJob, _ := fx.job(app, appEval, status.JobFailed)

	friend := fx.browser().login("friend") // reads octo/secret
	token := friend.mintAPI("laptop")
	if !strings.HasPrefix(token, apitoken.Prefix) {
		t.Errorf("token %q lacks the %s prefix", token, apitoken.Prefix)
	}
	// Hashed at rest, shown once.
	if n := fx.id(`SELECT count(*) FROM api_tokens WHERE token_hash = sha256(convert_to($1, 'UTF8'))`, token); n != 1 {
		t.Fatalf("%d rows hold the token's sha256, want 1", n)
	}
	if n := fx.id(`SELECT count(*) FROM api_tokens t WHERE strpos(t::text, $1) > 0`, token[4:20]); n != 0 {
		t.Fatalf("the token is stored in the clear")
	}
	_, body := friend.get("/ci/tokens")
	if strings.Contains(body, token) {
		t.Fatalf("the tokens page shows the token again")
	}
	id := apiTokenID(t, body, "laptop")

	// It reads what its user may: the private project's page, its API, its build; the same
	// 404 as the pages for a user who may not.
	for _, path := range []string{"/ci/secret/", fmt.Sprintf("/api/v1/builds/%d", secretJob), "/api/v1/projects/secret"} {
		if code, body, _ := fx.bearer("GET", path, token); code != http.StatusOK {
			t.Errorf("GET %s with the friend's token: %d, want 200\n%s", path, code, body)
		}
		if code, _, _ := fx.bearer("GET", path, ""); code != http.StatusNotFound {
			t.Errorf("GET %s anonymously: %d, want 404", path, code)
		}
	}
	if _, body, _ := fx.bearer("GET", "/api/v1/projects", token); !strings.Contains(body, `"secret"`) {
		t.Errorf("/api/v1/projects with the friend's token does not list secret:\n%s", body)
	}
	reader := fx.browser().login("reader") // reads octo/app, not octo/secret; may not push
	readerToken := reader.mintAPI("script")
	if code, _, _ := fx.bearer("GET", "/api/v1/projects/secret", readerToken); code != http.StatusNotFound {
		t.Errorf("the reader's token reads the private project: %d, want 404", code)
	}
	if code, _, _ := fx.bearer("POST", fmt.Sprintf("/api/builds/%d/rebuild", secretJob), readerToken); code != http.StatusNotFound {
		t.Errorf("the reader's token rebuilds a build it may not read: %d, want 404", code)
	}
	if n := fx.id(`SELECT count(*) FROM api_tokens WHERE id = $1 AND last_used_at IS NOT NULL`, id); n != 1 {
		t.Errorf("the token's last use is not recorded")
	}

	// Acting: its user's rights, no CSRF token; a refusal changes nothing.
	writer := fx.browser().login("writer") // may push to octo/app
	writerToken := writer.mintAPI("ci-bot")
	if code, body, _ := fx.bearer("POST", fmt.Sprintf("/api/builds/%d/rebuild", appJob), readerToken); code != http.StatusForbidden {
		t.Errorf("the reader's token rebuilds app's job: %d, want 403\n%s", code, body)
	}
	if st := fx.jobStatus(appJob); st != status.JobFailed {
		t.Errorf("after a refused rebuild the job is %s", st)
	}
	if code, body, _ := fx.bearer("POST", fmt.Sprintf("/api/builds/%d/rebuild", appJob), writerToken); code != http.StatusOK {
		t.Errorf("the writer's token rebuilds app's job: %d, want 200\n%s", code, body)
	}
	if st := fx.jobStatus(appJob); st != status.JobPending {
		t.Errorf("after the rebuild the job is %s, want pending", st)
	}
	running := fx.eval(app, status.EvalRunning, 0, "")
	if code, _, _ := fx.bearer("POST", fmt.Sprintf("/api/evals/%d/cancel", running), writerToken); code != http.StatusOK {
		t.Errorf("the writer's token cancels app's evaluation: %d, want 200", code)
	}

	// Audited: who, which token, what; shown on the build and evaluation pages and in the API.
	if who := fx.str(`SELECT actor || ' ' || token_name || ' ' || action FROM action_log WHERE job_id = $1`, appJob); who != "github:writer ci-bot rebuild" {
		t.Errorf("audit of the rebuild: %q", who)
	}
	if _, body := writer.get(fmt.Sprintf("/ci/app/build/%d", appJob)); !strings.Contains(body, `rebuilt by github:writer (token &#34;ci-bot&#34;)`) {
		t.Errorf("the build page does not show the rebuild:\n%s", body)
	}
	if _, body := writer.get(fmt.Sprintf("/ci/app/eval/%d", running)); !strings.Contains(body, `cancelled by github:writer (token &#34;ci-bot&#34;)`) {
		t.Errorf("the evaluation page does not show the cancel:\n%s", body)
	}
	_, body, _ = fx.bearer("GET", fmt.Sprintf("/api/v1/builds/%d", appJob), writerToken)
	var b struct {
		Actions []struct {
			Action    string `json:"action"`
			Actor     string `json:"actor"`
			TokenName string `json:"token_name"`
		} `json:"actions"`
	}
	if err := json.Unmarshal([]byte(body), &b); err != nil || len(b.Actions) != 1 || b.Actions[0].Action != "rebuild" ||
		b.Actions[0].Actor != "github:writer" || b.Actions[0].TokenName != "ci-bot" {
		t.Errorf("/api/v1/builds/%d actions: %+v, %v\n%s", appJob, b.Actions, err, body)
	}
	// A session's action is recorded too, without a token.
	if resp, body := writer.post(fmt.Sprintf("/api/evals/%d/re-evaluate", running), url.Values{"csrf": {writer.csrf()}}, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("re-evaluate through the session: %d %s", resp.StatusCode, body)
	}
	if who := fx.str(`SELECT actor || coalesce(token_name, '-') FROM action_log WHERE eval_id = $1 AND action = 're-evaluate'`, running); who != "github:writer-" {
		t.Errorf("audit of the session's action: %q", who)
	}

	// A cache token is not an API token, nor the other way round.
	cacheToken := friend.mint("nix")
	if code, body, _ := fx.bearer("GET", "/api/v1/projects", cacheToken); code != http.StatusUnauthorized || !strings.Contains(body, `"error"`) {
		t.Errorf("the API with a cache token: %d %s, want a JSON 401", code, body)
	}
	hash := strings.TrimPrefix(drv, "/nix/store/")[:32]
	fx.id(`INSERT INTO derivation_outputs (drv_path, output_name, output_path) VALUES ($1, 'out', $2) RETURNING 1`, drv, "/nix/store/"+hash+"-out")
	if ok, _ := fx.tokenReads(cacheToken, hash); !ok {
		t.Fatalf("the friend's cache token does not read the private path")
	}
	if ok, _ := fx.tokenReads(token, hash); ok {
		t.Errorf("the cache takes an API token")
	}

	// Revoked in the UI: refused at the next request. Expired: refused.
	resp, _ := friend.post(fmt.Sprintf("/ci/tokens/api/%d/revoke", id), url.Values{"csrf": {friend.csrf()}}, acceptHTML)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	if code, body, _ := fx.bearer("GET", "/api/v1/projects", token); code != http.StatusUnauthorized || !strings.Contains(body, `"error"`) {
		t.Errorf("a revoked token: %d %s, want a JSON 401", code, body)
	}
	if code, _, _ := fx.bearer("GET", "/ci/secret/", token); code != http.StatusUnauthorized {
		t.Errorf("a revoked token on a page: %d, want 401", code)
	}
	if _, err := fx.pool.Exec(fx.ctx, `UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE name = 'ci-bot'`); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := fx.bearer("POST", fmt.Sprintf("/api/builds/%d/cancel", appJob), writerToken); code != http.StatusUnauthorized {
		t.Errorf("an expired token acts: %d, want 401", code)
	}
	if st := fx.jobStatus(appJob); st != status.JobPending {
		t.Errorf("an expired token's cancel changed the job to %s", st)
	}
	// Another user cannot revoke someone's token; a token cannot mint one.
	if resp, _ := reader.post(fmt.Sprintf("/ci/tokens/api/%d/revoke", apiTokenID(t, fx.mustGet(writer, "/ci/tokens"), "ci-bot")), url.Values{"csrf": {reader.csrf()}}, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("another user's revocation: %d, want 404", resp.StatusCode)
	}
	if code, _, _ := fx.bearer("POST", "/ci/tokens/api", readerToken); code != http.StatusBadRequest {
		t.Errorf("a token mints a token: %d, want 400", code)
	}
}

func (fx *authFixture) mustGet(b *browser, path string) string {
	fx.t.Helper()
	resp, body := b.get(path)
	if resp.StatusCode != http.StatusOK {
		fx.t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	return body
}

// A machine token minted admin is the admin token; one of projects reads those and acts on
// nothing.
func TestMachineTokens(t *testing.T) {
	fx := newAuthFixture(t)
	fx.withAPI()
	secret := fx.project("secret", "github", "octo/secret", true)
	fx.project("other", "github", "octo/other", true)
	job, _ := fx.job(secret, 0, status.JobFailed)
	admin, err := apitoken.MintMachine(fx.ctx, fx.pool, "deploy", time.Now().Add(time.Hour), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	reads, err := apitoken.MintMachine(fx.ctx, fx.pool, "dashboard", time.Now().Add(time.Hour), false, []string{"secret"})
	if err != nil {
		t.Fatal(err)
	}
	if code, _, _ := fx.bearer("GET", "/api/v1/projects/other", admin.Token); code != http.StatusOK {
		t.Errorf("the admin machine token reads a private project: %d", code)
	}
	if code, _, _ := fx.bearer("GET", "/api/v1/projects/secret", reads.Token); code != http.StatusOK {
		t.Errorf("the project machine token reads its project: %d", code)
	}
	if code, _, _ := fx.bearer("GET", "/api/v1/projects/other", reads.Token); code != http.StatusNotFound {
		t.Errorf("the project machine token reads another private project: %d, want 404", code)
	}
	if code, _, _ := fx.bearer("POST", fmt.Sprintf("/api/builds/%d/rebuild", job), reads.Token); code != http.StatusForbidden {
		t.Errorf("the project machine token rebuilds: %d, want 403", code)
	}
	if code, _, _ := fx.bearer("POST", fmt.Sprintf("/api/builds/%d/rebuild", job), admin.Token); code != http.StatusOK {
		t.Errorf("the admin machine token rebuilds: %d, want 200", code)
	}
	if who := fx.str(`SELECT actor || ' ' || token_name FROM action_log WHERE job_id = $1`, job); who != fmt.Sprintf("machine token %d deploy", admin.ID) {
		t.Errorf("audit of the machine token's rebuild: %q", who)
	}
	// A machine token that is not the admin's owns no token: it revokes none, not even itself.
	for _, path := range []string{fmt.Sprintf("/ci/tokens/api/%d/revoke", admin.ID), fmt.Sprintf("/ci/tokens/api/%d/revoke", reads.ID)} {
		if code, _, _ := fx.bearer("POST", path, reads.Token); code != http.StatusForbidden {
			t.Errorf("POST %s with the project machine token: %d, want 403", path, code)
		}
	}
	if code, _, _ := fx.bearer("GET", "/api/v1/projects/other", admin.Token); code != http.StatusOK {
		t.Errorf("the admin machine token after the project token's revokes: %d, want it still live", code)
	}
}

// manualClock is a clock the test moves.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// The API is rate-limited per token and per anonymous client: past the burst, 429 with
// Retry-After in whole seconds and a JSON error, until the bucket refills. The pages are not
// limited, and one client's bucket is not another's.
func TestAPIRateLimit(t *testing.T) {
	clock := &manualClock{t: time.Unix(1_700_000_000, 0)}
	fx := newAuthFixture(t, func(c *Config) {
		c.RateLimits = RateLimits{Rate: 1, Burst: 3, AnonymousRate: 0.5, AnonymousBurst: 2, Now: clock.now}
	})
	fx.withAPI()
	fx.project("app", "github", "octo/app", false)
	token := fx.browser().login("reader").mintAPI("busy")
	other := fx.browser().login("writer").mintAPI("calm")

	for i := range 3 {
		if code, _, _ := fx.bearer("GET", "/api/v1/projects", token); code != http.StatusOK {
			t.Fatalf("request %d of the burst: %d", i+1, code)
		}
	}
	code, body, h := fx.bearer("GET", "/api/v1/projects", token)
	if code != http.StatusTooManyRequests || h.Get("Retry-After") != "1" || !strings.Contains(body, `"error"`) {
		t.Fatalf("past the burst: %d, Retry-After %q, %s; want 429, 1, a JSON error", code, h.Get("Retry-After"), body)
	}
	if code, _, _ := fx.bearer("GET", "/api/v1/projects", other); code != http.StatusOK {
		t.Errorf("another token is limited by the busy one: %d", code)
	}
	if code, _, _ := fx.bearer("GET", "/ci/app/", token); code != http.StatusOK {
		t.Errorf("a page with the limited token: %d, want 200 (pages are not limited)", code)
	}
	clock.add(time.Second)
	if code, _, _ := fx.bearer("GET", "/api/v1/projects", token); code != http.StatusOK {
		t.Errorf("after the bucket refilled a token: %d, want 200", code)
	}

	// Anonymous clients by address: stricter.
	for range 2 {
		if code, _, _ := fx.bearer("GET", "/api/v1/projects", ""); code != http.StatusOK {
			t.Fatalf("anonymous burst: %d", code)
		}
	}
	code, _, h = fx.bearer("GET", "/api/v1/projects", "")
	if code != http.StatusTooManyRequests || h.Get("Retry-After") != "2" {
		t.Fatalf("anonymous past the burst: %d, Retry-After %q; want 429, 2", code, h.Get("Retry-After"))
	}
	// A page's live view (an EventSource: the build page's log) is not limited with the API.
	req, err := http.NewRequestWithContext(fx.ctx, http.MethodGet, fx.srv.URL+"/api/v1/projects", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		t.Errorf("an event stream request from the limited anonymous client: 429, want it not limited")
	}
	clock.add(2 * time.Second)
	if code, _, _ := fx.bearer("GET", "/api/v1/projects", ""); code != http.StatusOK {
		t.Errorf("anonymous after the refill: %d", code)
	}
}

// The command line's login: the callback, state and name are checked strictly.
func TestCLILoginParams(t *testing.T) {
	t.Parallel()
	state := strings.Repeat("s", 16)
	for _, c := range []struct {
		callback, state, name string
		wantErr               string
	}{
		{"http://127.0.0.1:8123/callback", state, "laptop", ""},
		{"http://localhost:8123/", state, "laptop", ""},
		{"http://localhost:1/x?y=z", strings.Repeat("a", 128), strings.Repeat("n", 100), ""},
		{"", state, "laptop", "callback is required"},
		{"https://127.0.0.1:8123/", state, "laptop", "must be an http:// URL"},
		{"http://evil.example:8123/", state, "laptop", "host must be 127.0.0.1 or localhost"},
		{"http://127.0.0.2:8123/", state, "laptop", "host must be 127.0.0.1 or localhost"},
		{"http://[::1]:8123/", state, "laptop", "host must be 127.0.0.1 or localhost"},
		{"http://127.0.0.1/", state, "laptop", "numeric port"},
		{"http://127.0.0.1:http/", state, "laptop", "not a URL"},
		{"http://127.0.0.1:99999/", state, "laptop", "numeric port"},
		{"http://127.0.0.1:0/", state, "laptop", "numeric port"},
		{"http://user:pw@127.0.0.1:8123/", state, "laptop", "user or password"},
		{"http://127.0.0.1:8123/#x", state, "laptop", "plain"},
		{"javascript:alert(1)", state, "laptop", "must be an http:// URL"},
		{"//127.0.0.1:8123/", state, "laptop", "must be an http:// URL"},
		{"http://127.0.0.1:8123/", "short", "laptop", "state must be"},
		{"http://127.0.0.1:8123/", strings.Repeat("a", 129), "laptop", "state must be"},
		{"http://127.0.0.1:8123/", state + "!!", "laptop", "state must be"},
		{"http://127.0.0.1:8123/", state, "", "name"},
		{"http://127.0.0.1:8123/", state, strings.Repeat("n", 101), "name"},
		{"http://127.0.0.1:8123/", state, "two\nlines", "name"},
	} {
		q := url.Values{"callback": {c.callback}, "state": {c.state}, "name": {c.name}}
		_, err := cliParams(q.Get)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%q %q %q: %v, want accepted", c.callback, c.state, c.name, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%q %q %q: %v, want an error saying %q", c.callback, c.state, c.name, err, c.wantErr)
		}
	}
}

var cliFormRE = regexp.MustCompile(`(?s)<form method="post" action="([^"]+)" id="cli-callback">.*name="token" value="(hci_[^"]+)".*name="state" value="([^"]+)"`)

// harmonia-ci login's page: to the login first; then a confirmation whose POST mints a token
// and answers a form that posts it and the state to the callback.
func TestCLILoginFlow(t *testing.T) {
	fx := newAuthFixture(t)
	fx.withAPI()
	fx.project("secret", "github", "octo/secret", true)
	state := "abcdefghijklmnop-_42"
	q := url.Values{"callback": {"http://127.0.0.1:8123/cb"}, "state": {state}, "name": {"my laptop"}}
	path := "/ci/tokens/cli?" + q.Encode()
	b := fx.browser()
	resp, _ := b.get(path)
	wantLoc := "/ci/login?" + url.Values{"next": {path}}.Encode()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusFound || loc != wantLoc {
		t.Fatalf("logged out: %d to %q, want the login coming back", resp.StatusCode, loc)
	}
	b.login("friend")
	resp, body := b.get(path)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Create a token named “my laptop” for the command line? It can do what you can do. Expires in 90 days.") {
		t.Fatalf("confirmation: %d\n%s", resp.StatusCode, body)
	}
	if resp, _ := b.get("/ci/tokens/cli?callback=http://evil.example:80/&state=" + state + "&name=x"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a foreign callback: %d, want 400", resp.StatusCode)
	}
	form := url.Values{"callback": q["callback"], "state": q["state"], "name": q["name"]}
	if resp, _ := b.post("/ci/tokens/cli", form, acceptHTML); resp.StatusCode != http.StatusForbidden {
		t.Errorf("the POST without the CSRF token: %d, want 403", resp.StatusCode)
	}
	form.Set("csrf", b.csrf())
	resp, body = b.post("/ci/tokens/cli", form, acceptHTML)
	m := cliFormRE.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		t.Fatalf("the POST: %d, no callback form:\n%s", resp.StatusCode, body)
	}
	if m[1] != "http://127.0.0.1:8123/cb" || m[3] != state {
		t.Errorf("callback form to %q with state %q", m[1], m[3])
	}
	if !strings.Contains(body, `<script src="/ci/static/cli-callback.js">`) {
		t.Errorf("no submitting script")
	}
	if code, _, _ := fx.bearer("GET", "/api/v1/projects/secret", m[2]); code != http.StatusOK {
		t.Errorf("the command line's token reads the user's private project: %d", code)
	}
	if name := fx.str(`SELECT name FROM api_tokens`); name != "my laptop" {
		t.Errorf("token named %q", name)
	}
}
