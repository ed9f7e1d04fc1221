package githubtest_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
)

const sha1 = "1111111111111111111111111111111111111111"

func appKey(t *testing.T, s *githubtest.Server) *rsa.PrivateKey {
	t.Helper()
	block, _ := pem.Decode(s.PrivateKeyPEM)
	if block == nil {
		t.Fatal("PrivateKeyPEM: no PEM block")
	}
	k, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func signJWT(t *testing.T, k *rsa.PrivateKey, method jwt.SigningMethod, claims jwt.MapClaims) string {
	t.Helper()
	var key any = k
	if method == jwt.SigningMethodHS256 {
		key = []byte("secret")
	}
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// answer is one HTTP exchange with the stand-in.
type answer struct {
	code   int
	header http.Header
	body   []byte
}

func (a answer) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("decode %s: %v", a.body, err)
	}
}

func call(t *testing.T, s *githubtest.Server, method, path, auth string, body any) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", githubtest.APIVersion)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}

func goodClaims(s *githubtest.Server) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{"iat": now.Add(-time.Minute).Unix(), "exp": now.Add(9 * time.Minute).Unix(), "iss": s.AppID}
}

// exchange makes an installation token the way an App does.
func exchange(t *testing.T, s *githubtest.Server, inst int64) string {
	t.Helper()
	a := call(t, s, "POST", fmt.Sprintf("/app/installations/%d/access_tokens", inst),
		"Bearer "+signJWT(t, appKey(t, s), jwt.SigningMethodRS256, goodClaims(s)), nil)
	if a.code != http.StatusCreated {
		t.Fatalf("access_tokens: %d %s", a.code, a.body)
	}
	var tok struct {
		Token     string `json:"token"`
		ExpiresAt string `json:"expires_at"`
	}
	a.json(t, &tok)
	return tok.Token
}

func TestAppJWT(t *testing.T) {
	t.Parallel()
	s := githubtest.New(t)
	s.AddInstallation(7, githubtest.Repo{FullName: "octo/one"})
	k := appKey(t, s)
	other, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	with := func(k string, v any) jwt.MapClaims {
		c := goodClaims(s)
		c[k] = v
		return c
	}
	for _, c := range []struct {
		name string
		auth string
		code int
		msg  string
	}{
		{"good, numeric iss", "Bearer " + signJWT(t, k, jwt.SigningMethodRS256, goodClaims(s)), 200, ""},
		{"good, string iss", "Bearer " + signJWT(t, k, jwt.SigningMethodRS256, with("iss", strconv.FormatInt(s.AppID, 10))), 200, ""},
		{"none", "", 401, "Requires authentication"},
		{"garbage", "Bearer not.a.jwt", 401, "A JSON web token could not be decoded"},
		{"other key", "Bearer " + signJWT(t, other, jwt.SigningMethodRS256, goodClaims(s)), 401, "A JSON web token could not be decoded"},
		{"HS256", "Bearer " + signJWT(t, k, jwt.SigningMethodHS256, goodClaims(s)), 401, "A JSON web token could not be decoded"},
		{"other app", "Bearer " + signJWT(t, k, jwt.SigningMethodRS256, with("iss", s.AppID+1)), 401, "Integration not found"},
		{"expired", "Bearer " + signJWT(t, k, jwt.SigningMethodRS256, with("exp", now.Add(-time.Second).Unix())), 401, "'Expiration time' claim ('exp') must be"},
		{"too long", "Bearer " + signJWT(t, k, jwt.SigningMethodRS256, with("exp", now.Add(10*time.Minute).Unix())), 401, "too far in the future"},
		{"from the future", "Bearer " + signJWT(t, k, jwt.SigningMethodRS256, with("iat", now.Add(5*time.Minute).Unix())), 401, "'Issued at' claim"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := call(t, s, "GET", "/app/installations", c.auth, nil)
			if a.code != c.code {
				t.Fatalf("code %d, want %d: %s", a.code, c.code, a.body)
			}
			if c.code == 200 {
				var insts []struct {
					ID    int64 `json:"id"`
					AppID int64 `json:"app_id"`
				}
				a.json(t, &insts)
				if len(insts) != 1 || insts[0].ID != 7 || insts[0].AppID != s.AppID {
					t.Errorf("installations %s", a.body)
				}
				return
			}
			var e struct {
				Message          string `json:"message"`
				DocumentationURL string `json:"documentation_url"`
			}
			a.json(t, &e)
			if !strings.Contains(e.Message, c.msg) || e.DocumentationURL == "" {
				t.Errorf("body %s, want message %q and documentation_url", a.body, c.msg)
			}
		})
	}
}

func TestInstallationToken(t *testing.T) {
	t.Parallel()
	s := githubtest.New(t)
	s.AddInstallation(7, githubtest.Repo{FullName: "octo/one"})
	s.AddInstallation(8, githubtest.Repo{FullName: "octo/two"})
	s.SetBranch("octo/one", "main", sha1)
	s.SetBranch("octo/two", "main", sha1)
	jwtAuth := "Bearer " + signJWT(t, appKey(t, s), jwt.SigningMethodRS256, goodClaims(s))

	a := call(t, s, "POST", "/app/installations/7/access_tokens", jwtAuth, nil)
	var tok struct {
		Token     string `json:"token"`
		ExpiresAt string `json:"expires_at"`
	}
	a.json(t, &tok)
	exp, err := time.Parse(time.RFC3339, tok.ExpiresAt)
	if a.code != 201 || !strings.HasPrefix(tok.Token, "ghs_") || err != nil ||
		exp.Sub(time.Now()) < 59*time.Minute || exp.Sub(time.Now()) > time.Hour {
		t.Fatalf("access_tokens: %d %s", a.code, a.body)
	}
	if !strings.HasSuffix(tok.ExpiresAt, "Z") {
		t.Errorf("expires_at %q: GitHub writes UTC with Z", tok.ExpiresAt)
	}
	if n := s.TokenExchanges(); n != 1 {
		t.Errorf("TokenExchanges = %d, want 1", n)
	}
	if a := call(t, s, "POST", "/app/installations/99/access_tokens", jwtAuth, nil); a.code != 404 {
		t.Errorf("unknown installation: %d", a.code)
	}
	s.SuspendInstallation(8)
	if a := call(t, s, "POST", "/app/installations/8/access_tokens", jwtAuth, nil); a.code != 403 {
		t.Errorf("suspended installation: %d %s", a.code, a.body)
	}
	var insts []struct {
		ID          int64   `json:"id"`
		SuspendedAt *string `json:"suspended_at"`
	}
	call(t, s, "GET", "/app/installations", jwtAuth, nil).json(t, &insts)
	if len(insts) != 2 || insts[0].SuspendedAt != nil || insts[1].SuspendedAt == nil {
		t.Errorf("installations %+v", insts)
	}

	for _, c := range []struct {
		name, path, auth string
		code             int
	}{
		{"Bearer", "/repos/octo/one/branches/main", "Bearer " + tok.Token, 200},
		{"token", "/repos/octo/one/branches/main", "token " + tok.Token, 200},
		{"case-insensitive names", "/repos/OCTO/One/branches/main", "token " + tok.Token, 200},
		{"none", "/repos/octo/one/branches/main", "", 401},
		{"wrong", "/repos/octo/one/branches/main", "token ghs_wrong", 401},
		{"JWT on a repository", "/repos/octo/one/branches/main", jwtAuth, 401},
		{"another installation's repository", "/repos/octo/two/branches/main", "token " + tok.Token, 404},
		{"token on /app", "/app/installations", "token " + tok.Token, 401},
	} {
		if a := call(t, s, "GET", c.path, c.auth, nil); a.code != c.code {
			t.Errorf("%s: GET %s: %d, want %d: %s", c.name, c.path, a.code, c.code, a.body)
		}
	}

	s.ExpireTokens()
	a = call(t, s, "GET", "/repos/octo/one/branches/main", "token "+tok.Token, nil)
	if a.code != 401 || !strings.Contains(string(a.body), `"Bad credentials"`) {
		t.Errorf("expired token: %d %s", a.code, a.body)
	}
}

func TestRepoInstallation(t *testing.T) {
	t.Parallel()
	s := githubtest.New(t)
	s.AddInstallation(7, githubtest.Repo{FullName: "octo/one"})
	jwtAuth := "Bearer " + signJWT(t, appKey(t, s), jwt.SigningMethodRS256, goodClaims(s))
	a := call(t, s, "GET", "/repos/octo/one/installation", jwtAuth, nil)
	var inst struct {
		ID int64 `json:"id"`
	}
	a.json(t, &inst)
	if a.code != 200 || inst.ID != 7 {
		t.Errorf("installation: %d %s", a.code, a.body)
	}
	if a := call(t, s, "GET", "/repos/octo/none/installation", jwtAuth, nil); a.code != 404 {
		t.Errorf("unknown repository: %d", a.code)
	}
}

func TestPagination(t *testing.T) {
	t.Parallel()
	s := githubtest.New(t)
	var repos []githubtest.Repo
	for i := range 7 {
		repos = append(repos, githubtest.Repo{FullName: fmt.Sprintf("octo/r%d", i)})
	}
	s.AddInstallation(7, repos...)
	auth := "token " + exchange(t, s, 7)
	base := s.URL + "/installation/repositories"
	for _, c := range []struct {
		query string
		names []string
		link  string
	}{
		{"", []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6"}, ""},
		{"?per_page=3", []string{"r0", "r1", "r2"},
			`<` + base + `?per_page=3&page=2>; rel="next", <` + base + `?per_page=3&page=3>; rel="last"`},
		{"?per_page=3&page=2", []string{"r3", "r4", "r5"},
			`<` + base + `?per_page=3&page=1>; rel="prev", <` + base + `?per_page=3&page=3>; rel="next", <` +
				base + `?per_page=3&page=3>; rel="last", <` + base + `?per_page=3&page=1>; rel="first"`},
		{"?page=3&per_page=3", []string{"r6"},
			`<` + base + `?per_page=3&page=2>; rel="prev", <` + base + `?per_page=3&page=1>; rel="first"`},
		{"?per_page=500", []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6"}, ""},
	} {
		a := call(t, s, "GET", "/installation/repositories"+c.query, auth, nil)
		var page struct {
			TotalCount   int `json:"total_count"`
			Repositories []struct {
				Name     string `json:"name"`
				FullName string `json:"full_name"`
				CloneURL string `json:"clone_url"`
				Owner    struct {
					Login string `json:"login"`
				} `json:"owner"`
			} `json:"repositories"`
		}
		a.json(t, &page)
		var names []string
		for _, r := range page.Repositories {
			names = append(names, r.Name)
			if r.Owner.Login != "octo" || r.FullName != "octo/"+r.Name || r.CloneURL != "https://github.com/octo/"+r.Name+".git" {
				t.Errorf("%s: repository %+v", c.query, r)
			}
		}
		if page.TotalCount != 7 || !slices.Equal(names, c.names) {
			t.Errorf("%s: total %d, names %v, want 7, %v", c.query, page.TotalCount, names, c.names)
		}
		if got := a.header.Get("Link"); got != c.link {
			t.Errorf("%s: Link\n %s\nwant\n %s", c.query, got, c.link)
		}
	}
}

func TestRateLimitHeaders(t *testing.T) {
	t.Parallel()
	s := githubtest.New(t)
	s.AddInstallation(7, githubtest.Repo{FullName: "octo/one"})
	auth := "token " + exchange(t, s, 7)
	first := call(t, s, "GET", "/repos/octo/one/branches/nope", auth, nil)
	second := call(t, s, "GET", "/nothing/here", auth, nil)
	for _, a := range []answer{first, second} {
		for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Used", "X-RateLimit-Resource"} {
			if a.header.Get(h) == "" {
				t.Errorf("no %s", h)
			}
		}
	}
	if first.header.Get("X-RateLimit-Limit") != "5000" || first.header.Get("X-RateLimit-Used") != "1" ||
		first.header.Get("X-RateLimit-Remaining") != "4999" || second.header.Get("X-RateLimit-Remaining") != "4998" {
		t.Errorf("counts: %v then %v", first.header, second.header)
	}
	var e struct {
		Message string `json:"message"`
	}
	second.json(t, &e)
	if second.code != 404 || e.Message != "Not Found" || !strings.HasPrefix(second.header.Get("Content-Type"), "application/json") {
		t.Errorf("unknown path: %d %s", second.code, second.body)
	}

	s.RateLimitNext(1, 1500*time.Millisecond)
	a := call(t, s, "GET", "/repos/octo/one/branches/main", auth, nil)
	a.json(t, &e)
	if a.code != 403 || a.header.Get("Retry-After") != "2" || !strings.HasPrefix(e.Message, "You have exceeded a secondary rate limit") {
		t.Errorf("secondary limit: %d %v %s", a.code, a.header, a.body)
	}
	reset := time.Now().Add(42 * time.Second)
	s.PrimaryRateLimitNext(1, reset)
	a = call(t, s, "GET", "/repos/octo/one/branches/main", auth, nil)
	a.json(t, &e)
	if a.code != 403 || a.header.Get("X-RateLimit-Remaining") != "0" || a.header.Get("X-RateLimit-Reset") != strconv.FormatInt(reset.Unix(), 10) ||
		e.Message != "API rate limit exceeded for installation ID 7." {
		t.Errorf("primary limit: %d %v %s", a.code, a.header, a.body)
	}
	if a := call(t, s, "GET", "/repos/octo/one/branches/nope", auth, nil); a.code != 404 {
		t.Errorf("after the limits: %d", a.code)
	}
}

func TestRepositoryEndpoints(t *testing.T) {
	t.Parallel()
	s := githubtest.New(t)
	s.AddInstallation(7, githubtest.Repo{FullName: "octo/one"})
	s.AddCollaborator("octo/one", "Alice")
	s.SetBranch("octo/one", "feature/x", sha1)
	s.SetPullRequest("octo/one", githubtest.PR{Number: 3, User: "mallory", HeadSHA: sha1, HeadRef: "evil", HeadRepo: "mallory/one"})
	auth := "token " + exchange(t, s, 7)

	for _, c := range []struct {
		path string
		code int
	}{
		{"/repos/octo/one/collaborators/alice", 204},
		{"/repos/octo/one/collaborators/octo", 204}, // the owner
		{"/repos/octo/one/collaborators/bob", 404},
		{"/repos/octo/one/branches/feature/x", 200},
		{"/repos/octo/one/branches/feature%2Fx", 200},
		{"/repos/octo/one/branches/feature", 404},
		{"/repos/octo/one/pulls/3", 200},
		{"/repos/octo/one/pulls/4", 404},
	} {
		if a := call(t, s, "GET", c.path, auth, nil); a.code != c.code {
			t.Errorf("GET %s: %d, want %d: %s", c.path, a.code, c.code, a.body)
		}
	}

	var b struct {
		Name   string `json:"name"`
		Commit struct {
			SHA string `json:"sha"`
		} `json:"commit"`
	}
	call(t, s, "GET", "/repos/octo/one/branches/feature%2Fx", auth, nil).json(t, &b)
	if b.Name != "feature/x" || b.Commit.SHA != sha1 {
		t.Errorf("branch %+v", b)
	}
	var pr struct {
		Number int    `json:"number"`
		State  string `json:"state"`
		User   struct{ Login string }
		Head   struct {
			SHA, Ref string
			Repo     struct {
				FullName string `json:"full_name"`
			}
		}
		Base struct {
			Ref  string
			Repo struct {
				FullName string `json:"full_name"`
			}
		}
	}
	call(t, s, "GET", "/repos/octo/one/pulls/3", auth, nil).json(t, &pr)
	if pr.Number != 3 || pr.State != "open" || pr.User.Login != "mallory" || pr.Head.SHA != sha1 || pr.Head.Ref != "evil" ||
		pr.Head.Repo.FullName != "mallory/one" || pr.Base.Ref != "main" || pr.Base.Repo.FullName != "octo/one" {
		t.Errorf("pull request %+v", pr)
	}
	s.SetPullRequest("octo/one", githubtest.PR{Number: 3, User: "mallory", HeadSHA: sha1, HeadRef: "evil", HeadRepoDeleted: true})
	if a := call(t, s, "GET", "/repos/octo/one/pulls/3", auth, nil); !bytes.Contains(a.body, []byte(`"repo":null`)) {
		t.Errorf("deleted fork: %s", a.body)
	}
}

func TestStatuses(t *testing.T) {
	t.Parallel()
	s := githubtest.New(t)
	s.AddInstallation(7, githubtest.Repo{FullName: "octo/one"})
	auth := "token " + exchange(t, s, 7)
	post := func(body map[string]any) answer {
		return call(t, s, "POST", "/repos/octo/one/statuses/"+sha1, auth, body)
	}
	for i, st := range []string{"pending", "success", "failure"} {
		a := post(map[string]any{"state": st, "context": "ci/" + strconv.Itoa(i%2), "description": "d", "target_url": "https://ci/x"})
		var got struct {
			ID      int64  `json:"id"`
			State   string `json:"state"`
			Context string `json:"context"`
			Creator struct{ Login string }
		}
		a.json(t, &got)
		if a.code != 201 || got.State != st || got.ID == 0 || got.Creator.Login != "harmonia-ci-test[bot]" {
			t.Errorf("POST status %s: %d %s", st, a.code, a.body)
		}
	}
	for _, c := range []struct {
		name string
		body map[string]any
	}{
		{"bad state", map[string]any{"state": "done", "context": "c"}},
		{"long description", map[string]any{"state": "success", "context": "c", "description": strings.Repeat("x", 141)}},
	} {
		if a := post(c.body); a.code != 422 || !bytes.Contains(a.body, []byte("Validation Failed")) {
			t.Errorf("%s: %d %s", c.name, a.code, a.body)
		}
	}
	if a := call(t, s, "POST", "/repos/octo/one/statuses/abc", auth, map[string]any{"state": "success"}); a.code != 422 {
		t.Errorf("short sha: %d", a.code)
	}

	got := s.Statuses("octo/one", sha1)
	if len(got) != 3 || got[0].State != "pending" || got[2].State != "failure" || got[2].Context != "ci/0" {
		t.Errorf("Statuses = %+v", got)
	}
	a := call(t, s, "GET", "/repos/octo/one/commits/"+sha1+"/statuses?per_page=2", auth, nil)
	var list []struct {
		State   string `json:"state"`
		Context string `json:"context"`
	}
	a.json(t, &list)
	if len(list) != 2 || list[0].State != "failure" || list[1].State != "success" || !strings.Contains(a.header.Get("Link"), `rel="next"`) {
		t.Errorf("newest first: %s, Link %q", a.body, a.header.Get("Link"))
	}
}

func TestDeliver(t *testing.T) {
	t.Parallel()
	s := githubtest.New(t)
	type delivery struct {
		header http.Header
		body   []byte
	}
	got := make(chan delivery, 1)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- delivery{r.Header.Clone(), b}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer hook.Close()

	repo := githubtest.Repo{FullName: "octo/one"}
	payload := githubtest.PushPayload(githubtest.Push{Repo: repo, Ref: "refs/heads/main", After: sha1, Sender: "alice", Installation: 7})
	resp, err := s.Deliver(context.Background(), hook.URL, "push", payload)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Errorf("status %d", resp.StatusCode)
	}
	d := <-got
	mac := hmac.New(sha256.New, s.WebhookSecret)
	mac.Write(d.body)
	if want := "sha256=" + hex.EncodeToString(mac.Sum(nil)); d.header.Get("X-Hub-Signature-256") != want {
		t.Errorf("X-Hub-Signature-256 %q, want %q", d.header.Get("X-Hub-Signature-256"), want)
	}
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	if d.header.Get("X-GitHub-Event") != "push" || !uuidRE.MatchString(d.header.Get("X-GitHub-Delivery")) ||
		!strings.HasPrefix(d.header.Get("User-Agent"), "GitHub-Hookshot/") || d.header.Get("Content-Type") != "application/json" ||
		!strings.HasPrefix(d.header.Get("X-Hub-Signature"), "sha1=") {
		t.Errorf("headers %v", d.header)
	}
	var p struct {
		Ref, After string
		Repository struct {
			FullName  string `json:"full_name"`
			CreatedAt int64  `json:"created_at"` // push payloads alone use Unix seconds
			Owner     struct{ Login, Name string }
		}
		Installation struct{ ID int64 }
	}
	if err := json.Unmarshal(d.body, &p); err != nil {
		t.Fatal(err)
	}
	if p.Ref != "refs/heads/main" || p.After != sha1 || p.Repository.FullName != "octo/one" || p.Repository.CreatedAt == 0 ||
		p.Repository.Owner.Name != "octo" || p.Installation.ID != 7 {
		t.Errorf("payload %s", d.body)
	}
}
