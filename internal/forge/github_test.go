package forge

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
)

const (
	ghSHA1 = "1111111111111111111111111111111111111111"
	ghSHA2 = "2222222222222222222222222222222222222222"
	ghZero = "0000000000000000000000000000000000000000"
)

var ghRepoOne = githubtest.Repo{FullName: "octo/one"}

// ghRoundTrip records what the forge sends.
type ghRoundTrip func(*http.Request) (*http.Response, error)

func (f ghRoundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ghBundle is a stand-in GitHub with installation 7 holding octo/one, and the forge talking to it.
type ghBundle struct {
	srv *githubtest.Server
	gh  *GitHub
	mu  sync.Mutex
	// paths are the escaped paths the forge requested, in order.
	paths []string
}

func (b *ghBundle) sent() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.paths)
}

// count is how many requests the stand-in saw of "METHOD path".
func (b *ghBundle) count(req string) int {
	n := 0
	for _, r := range b.srv.Requests() {
		if r == req {
			n++
		}
	}
	return n
}

func setupGitHub(t *testing.T) *ghBundle {
	t.Helper()
	b := &ghBundle{srv: githubtest.New(t)}
	b.srv.AddInstallation(7, ghRepoOne)
	// Every request must carry the headers GitHub asks clients for.
	client := &http.Client{Transport: ghRoundTrip(func(r *http.Request) (*http.Response, error) {
		for h, want := range map[string]string{"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "harmonia-ci"} {
			if got := r.Header.Get(h); got != want {
				t.Errorf("%s %s: %s %q, want %q", r.Method, r.URL, h, got, want)
			}
		}
		b.mu.Lock()
		b.paths = append(b.paths, r.Method+" "+r.URL.EscapedPath())
		b.mu.Unlock()
		return http.DefaultTransport.RoundTrip(r)
	})}
	gh, err := NewGitHub(GitHubConfig{Name: "gh", APIURL: b.srv.URL, AppID: b.srv.AppID, PrivateKey: b.srv.PrivateKeyPEM,
		WebhookSecret: b.srv.WebhookSecret, HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}
	b.gh = gh
	return b
}

func TestNewGitHub(t *testing.T) {
	t.Parallel()
	srv := githubtest.New(t)
	block, _ := pem.Decode(srv.PrivateKeyPEM)
	rsaKey, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(rsaKey)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8PEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKCS8PrivateKey(ecKey)
	ecPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecDER})
	good := GitHubConfig{Name: "gh", AppID: 1, PrivateKey: srv.PrivateKeyPEM, WebhookSecret: []byte("s")}

	for _, c := range []struct {
		name    string
		edit    func(*GitHubConfig)
		wantErr string // "" for success
		web     string
	}{
		{"defaults", func(*GitHubConfig) {}, "", "https://github.com"},
		{"PKCS#8", func(c *GitHubConfig) { c.PrivateKey = pkcs8PEM }, "", "https://github.com"},
		{"enterprise", func(c *GitHubConfig) { c.APIURL = "https://ghe.example.com/api/v3/" }, "", "https://ghe.example.com"},
		{"explicit web", func(c *GitHubConfig) {
			c.APIURL = "https://ghe.example.com/api/v3"
			c.WebURL = "https://code.example.com/"
		}, "", "https://code.example.com"},
		{"no app id", func(c *GitHubConfig) { c.AppID = 0 }, "app_id", ""},
		{"no key", func(c *GitHubConfig) { c.PrivateKey = nil }, "private key", ""},
		{"not PEM", func(c *GitHubConfig) { c.PrivateKey = []byte("-----BEGIN nonsense") }, "private key", ""},
		{"EC key", func(c *GitHubConfig) { c.PrivateKey = ecPEM }, "want RSA", ""},
		{"no secret", func(c *GitHubConfig) { c.WebhookSecret = nil }, "webhook secret", ""},
		{"bad API URL", func(c *GitHubConfig) { c.APIURL = "ftp://x" }, "API URL", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.edit(&cfg)
			gh, err := NewGitHub(cfg)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), "gh") {
					t.Fatalf("err = %v, want one naming the forge and %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, want := gh.CommitURL(Repo{Owner: "octo", Name: "one"}, ghSHA1), c.web+"/octo/one/commit/"+ghSHA1; got != want {
				t.Errorf("CommitURL = %q, want %q", got, want)
			}
			if gh.Name() != "gh" || gh.Type() != TypeGitHub {
				t.Errorf("Name, Type = %q, %q", gh.Name(), gh.Type())
			}
		})
	}
}

func TestGitHubTokenCache(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	b.srv.SetBranch("octo/one", "main", ghSHA1)
	ctx := context.Background()
	repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
	head := func() {
		t.Helper()
		if sha, err := b.gh.BranchHead(ctx, repo, "main"); err != nil || sha != ghSHA1 {
			t.Fatalf("BranchHead = %q, %v", sha, err)
		}
	}

	head()
	head()
	if n := b.srv.TokenExchanges(); n != 1 {
		t.Errorf("two calls made %d token exchanges, want 1", n)
	}

	// A token with less than tokenRefresh left is replaced before use.
	b.srv.SetTokenLifetime(4 * time.Minute)
	b.gh.forgetToken(context.Background(), 7, b.gh.tokens[7].token)
	head() // gets a token that is already due for refresh
	head()
	if n := b.srv.TokenExchanges(); n != 3 {
		t.Errorf("token exchanges = %d, want 3 (a token about to expire is refreshed)", n)
	}

	// GitHub refusing a cached token (revoked, expired early): one new exchange, then the call
	// goes through.
	b.srv.SetTokenLifetime(time.Hour)
	head()
	b.srv.ExpireTokens()
	head()
	if n := b.srv.TokenExchanges(); n != 5 {
		t.Errorf("token exchanges = %d, want 5", n)
	}
	if n := b.count("GET /repos/octo/one/branches/main"); n != 7 {
		t.Errorf("branch requests = %d, want 7 (6 calls, one retried after 401)", n)
	}
}

func TestGitHubTokenShared(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	b.srv.SetBranch("octo/one", "main", ghSHA1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := b.gh.BranchHead(context.Background(), Repo{Owner: "octo", Name: "one", InstallationID: 7}, "main"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := b.srv.TokenExchanges(); n != 1 {
		t.Errorf("8 concurrent calls made %d token exchanges, want 1", n)
	}
}

func TestGitHubInstallationLookup(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	b.srv.SetBranch("octo/one", "main", ghSHA1)
	repo := Repo{Owner: "octo", Name: "one"} // no InstallationID
	for range 2 {
		if sha, err := b.gh.BranchHead(context.Background(), repo, "main"); err != nil || sha != ghSHA1 {
			t.Fatalf("BranchHead = %q, %v", sha, err)
		}
	}
	if n := b.count("GET /repos/octo/one/installation"); n != 1 {
		t.Errorf("installation looked up %d times, want 1", n)
	}
	_, err := b.gh.BranchHead(context.Background(), Repo{Owner: "octo", Name: "unknown"}, "main")
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown repository: %v, want ErrNotFound", err)
	}
}

func TestGitHubListRepositories(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	var big []githubtest.Repo
	for i := range 250 {
		big = append(big, githubtest.Repo{FullName: fmt.Sprintf("org/r%03d", i)})
	}
	big[42].Private, big[42].DefaultBranch = true, "trunk"
	b.srv.AddInstallation(8, big...)
	b.srv.AddInstallation(9, githubtest.Repo{FullName: "alice/dots", CloneURL: "https://ghe.example.com/alice/dots.git"})
	b.srv.AddInstallation(10, githubtest.Repo{FullName: "frozen/repo"})
	b.srv.SuspendInstallation(10) // left out: GitHub refuses its tokens

	repos, err := b.gh.ListRepositories(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(repos) != 252 {
		t.Fatalf("%d repositories, want 252", len(repos))
	}
	want := map[string]Repository{
		"octo/one":   {Repo: Repo{Owner: "octo", Name: "one", InstallationID: 7}, CloneURL: "https://github.com/octo/one.git", DefaultBranch: "main"},
		"org/r042":   {Repo: Repo{Owner: "org", Name: "r042", InstallationID: 8}, CloneURL: "https://github.com/org/r042.git", DefaultBranch: "trunk", Private: true},
		"org/r249":   {Repo: Repo{Owner: "org", Name: "r249", InstallationID: 8}, CloneURL: "https://github.com/org/r249.git", DefaultBranch: "main"},
		"alice/dots": {Repo: Repo{Owner: "alice", Name: "dots", InstallationID: 9}, CloneURL: "https://ghe.example.com/alice/dots.git", DefaultBranch: "main"},
	}
	for _, r := range repos {
		if w, ok := want[r.FullName()]; ok {
			w.ForgeID = githubtest.RepoID(r.FullName())
			if r != w {
				t.Errorf("%s = %+v, want %+v", r.FullName(), r, w)
			}
			delete(want, r.FullName())
		}
	}
	if len(want) != 0 {
		t.Errorf("missing %v", want)
	}
	// 250 repositories at 100 a page are 3 pages, plus one page each for the other two.
	if n := b.count("GET /installation/repositories"); n != 5 {
		t.Errorf("%d repository pages read, want 5", n)
	}
	if n := b.srv.TokenExchanges(); n != 3 {
		t.Errorf("%d token exchanges, want one per active installation", n)
	}
}

func TestGitHubVerifyWebhook(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	body := []byte(`{"zen":"Keep it logically awesome.","hook_id":1}`)
	good := b.srv.WebhookHeader("ping", body).Get("X-Hub-Signature-256")
	for _, c := range []struct {
		name string
		sig  string // "" leaves the header out
		body []byte
		ok   bool
	}{
		{"good", good, body, true},
		{"missing", "", body, false},
		{"wrong", "sha256=" + Sign([]byte("other secret"), body), body, false},
		{"no prefix", strings.TrimPrefix(good, "sha256="), body, false},
		{"sha1 prefix", "sha1=" + strings.TrimPrefix(good, "sha256="), body, false},
		{"not hex", "sha256=zz", body, false},
		{"tampered body", good, bytes.Replace(body, []byte("1"), []byte("2"), 1), false},
	} {
		h := http.Header{}
		if c.sig != "" {
			h.Set("X-Hub-Signature-256", c.sig)
		}
		err := VerifyWebhook(b.gh, h, 0, c.body)
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, ErrSignature)) {
			t.Errorf("%s: err = %v", c.name, err)
		}
		// The App's one secret is good at the forge-wide URL only.
		if err := VerifyWebhook(b.gh, h, 7, c.body); !errors.Is(err, ErrSignature) {
			t.Errorf("%s at a repository's URL: err = %v, want ErrSignature", c.name, err)
		}
	}
}

func TestGitHubParseWebhook(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	id := b.srv.UserID
	repo := Repository{Repo: Repo{Owner: "octo", Name: "one", InstallationID: 7}, CloneURL: "https://github.com/octo/one.git", DefaultBranch: "main"}
	sameRepoPR := githubtest.PR{Number: 5, User: "alice", HeadSHA: ghSHA2, HeadRef: "feature/x"}
	forkPR := githubtest.PR{Number: 6, User: "mallory", HeadSHA: ghSHA2, HeadRef: "main", HeadRepo: "mallory/one"}
	push := func(edit func(*githubtest.Push)) map[string]any {
		p := githubtest.Push{Repo: ghRepoOne, Ref: "refs/heads/main", Before: ghSHA1, After: ghSHA2, Sender: "alice", Installation: 7}
		edit(&p)
		return githubtest.PushPayload(p)
	}
	pr := func(action string, p githubtest.PR) map[string]any {
		return githubtest.PullRequestPayload(githubtest.PullRequestEvent{Action: action, Repo: ghRepoOne, PR: p, Installation: 7})
	}
	comment := func(action string, onPR bool) map[string]any {
		return githubtest.CommentPayload(githubtest.Comment{Action: action, Repo: ghRepoOne, Number: 5, OnPullRequest: onPR,
			Commenter: "bob", Body: "/ci run", Installation: 7})
	}
	without := func(m map[string]any, k string) map[string]any { delete(m, k); return m }
	withRepo := func(m map[string]any, k string, v any) map[string]any {
		m["repository"].(map[string]any)[k] = v
		return m
	}

	for _, c := range []struct {
		name    string
		event   string
		payload any
		want    Event // DeliveryID is filled in
		wantErr bool
	}{
		{"push", "push", push(func(*githubtest.Push) {}),
			Event{Kind: EventPush, Type: "push", Repository: repo, Sender: "alice", SenderID: id("alice"), Branch: "main", After: ghSHA2, Tree: strings.Repeat("a", 40)}, false},
		{"push to a branch with a slash", "push", push(func(p *githubtest.Push) { p.Ref = "refs/heads/release/1.0" }),
			Event{Kind: EventPush, Type: "push", Repository: repo, Sender: "alice", SenderID: id("alice"), Branch: "release/1.0", After: ghSHA2, Tree: strings.Repeat("a", 40)}, false},
		{"new branch", "push", push(func(p *githubtest.Push) { p.Before = "" }),
			Event{Kind: EventPush, Type: "push", Repository: repo, Sender: "alice", SenderID: id("alice"), Branch: "main", After: ghSHA2, Tree: strings.Repeat("a", 40)}, false},
		{"owner by name only", "push", withRepo(withRepo(push(func(*githubtest.Push) {}), "full_name", ""), "owner", map[string]any{"name": "octo"}),
			Event{Kind: EventPush, Type: "push", Repository: repo, Sender: "alice", SenderID: id("alice"), Branch: "main", After: ghSHA2, Tree: strings.Repeat("a", 40)}, false},
		{"tag", "push", push(func(p *githubtest.Push) { p.Ref = "refs/tags/v1" }),
			Event{Kind: EventIgnored, Type: "push", Repository: repo, Sender: "alice", SenderID: id("alice")}, false},
		{"deleted branch", "push", push(func(p *githubtest.Push) { p.After, p.Deleted = ghZero, true }),
			Event{Kind: EventIgnored, Type: "push", Repository: repo, Sender: "alice", SenderID: id("alice")}, false},
		{"zero after", "push", push(func(p *githubtest.Push) { p.After = ghZero }),
			Event{Kind: EventIgnored, Type: "push", Repository: repo, Sender: "alice", SenderID: id("alice")}, false},
		{"short after", "push", push(func(p *githubtest.Push) { p.After = "abc123" }), Event{}, true},
		{"bad branch", "push", push(func(p *githubtest.Push) { p.Ref = "refs/heads/a..b" }), Event{}, true},
		{"push without repository", "push", without(push(func(*githubtest.Push) {}), "repository"), Event{}, true},
		{"bad repository name", "push", withRepo(push(func(*githubtest.Push) {}), "full_name", "octo/../etc"), Event{}, true},
		{"no clone url", "push", withRepo(push(func(*githubtest.Push) {}), "clone_url", ""), Event{}, true},

		{"pull request opened", "pull_request", pr("opened", sameRepoPR),
			Event{Kind: EventPullRequest, Type: "pull_request", Action: "opened", Repository: repo, Sender: "alice", SenderID: id("alice"),
				PullRequest: PullRequest{Number: 5, HeadSHA: ghSHA2, HeadBranch: "feature/x", BaseBranch: "main", Author: "alice", AuthorID: id("alice"), State: "open"}}, false},
		{"fork pull request synchronized", "pull_request", pr("synchronize", forkPR),
			Event{Kind: EventPullRequest, Type: "pull_request", Action: "synchronize", Repository: repo, Sender: "mallory", SenderID: id("mallory"),
				PullRequest: PullRequest{Number: 6, HeadSHA: ghSHA2, HeadBranch: "main", BaseBranch: "main", Author: "mallory", AuthorID: id("mallory"), Fork: true, State: "open"}}, false},
		{"reopened from a deleted fork", "pull_request", pr("reopened", githubtest.PR{Number: 6, User: "mallory", HeadSHA: ghSHA2, HeadRef: "main", HeadRepoDeleted: true}),
			Event{Kind: EventPullRequest, Type: "pull_request", Action: "reopened", Repository: repo, Sender: "mallory", SenderID: id("mallory"),
				PullRequest: PullRequest{Number: 6, HeadSHA: ghSHA2, HeadBranch: "main", BaseBranch: "main", Author: "mallory", AuthorID: id("mallory"), Fork: true, State: "open"}}, false},
		{"pull request closed", "pull_request", pr("closed", sameRepoPR), Event{Kind: EventIgnored, Type: "pull_request", Action: "closed", Repository: repo, Sender: "alice", SenderID: id("alice")}, false},
		{"pull request labeled", "pull_request", pr("labeled", sameRepoPR), Event{Kind: EventIgnored, Type: "pull_request", Action: "labeled", Repository: repo, Sender: "alice", SenderID: id("alice")}, false},
		{"pull request edited", "pull_request", pr("edited", sameRepoPR), Event{Kind: EventIgnored, Type: "pull_request", Action: "edited", Repository: repo, Sender: "alice", SenderID: id("alice")}, false},
		{"pull request bad head", "pull_request", pr("opened", githubtest.PR{Number: 5, User: "alice", HeadSHA: "nope", HeadRef: "x"}), Event{}, true},
		{"pull request missing", "pull_request", without(pr("opened", sameRepoPR), "pull_request"), Event{}, true},

		{"comment on a pull request", "issue_comment", comment("created", true),
			Event{Kind: EventComment, Type: "issue_comment", Action: "created", Repository: repo, Sender: "bob", SenderID: id("bob"),
				PullRequest: PullRequest{Number: 5}, Commenter: "bob", Body: "/ci run", CommentedAt: githubtest.PRCreatedAt}, false},
		{"comment on an issue", "issue_comment", comment("created", false), Event{Kind: EventIgnored, Type: "issue_comment", Action: "created", Repository: repo, Sender: "bob", SenderID: id("bob")}, false},
		{"comment edited", "issue_comment", comment("edited", true), Event{Kind: EventIgnored, Type: "issue_comment", Action: "edited", Repository: repo, Sender: "bob", SenderID: id("bob")}, false},
		{"comment without repository", "issue_comment", without(comment("created", true), "repository"), Event{}, true},

		{"installation", "installation", githubtest.InstallationPayload("created", 8, "alice", githubtest.Repo{FullName: "alice/dots"}),
			Event{Kind: EventInstallation, Type: "installation", Action: "created", Sender: "alice", SenderID: id("alice")}, false},
		{"installation repositories", "installation_repositories", map[string]any{"action": "added", "installation": map[string]any{"id": 8},
			"repositories_added": []any{map[string]any{"full_name": "alice/new"}}, "repositories_removed": []any{}, "sender": map[string]any{"login": "alice"}},
			Event{Kind: EventInstallation, Type: "installation_repositories", Action: "added", Sender: "alice"}, false},
		{"ping", "ping", map[string]any{"zen": "Design for failure.", "hook_id": 1, "hook": map[string]any{"type": "App"}},
			Event{Kind: EventIgnored, Type: "ping"}, false},
		{"unknown event", "check_suite", map[string]any{"action": "requested", "repository": githubtest.RepoJSON(ghRepoOne)},
			Event{Kind: EventIgnored, Type: "check_suite", Action: "requested"}, false},
		{"malformed", "push", []byte(`{"ref": "refs/heads/main",`), Event{}, true},
		{"wrong types", "push", []byte(`{"ref": 7}`), Event{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			body, ok := c.payload.([]byte)
			if !ok {
				var err error
				if body, err = json.Marshal(c.payload); err != nil {
					t.Fatal(err)
				}
			}
			h := b.srv.WebhookHeader(c.event, body)
			if err := VerifyWebhook(b.gh, h, 0, body); err != nil {
				t.Fatalf("VerifyWebhook: %v", err)
			}
			ev, err := b.gh.ParseWebhook(h, body)
			if c.wantErr {
				if err == nil || errors.Is(err, ErrSignature) {
					t.Fatalf("err = %v, want a parse error (not ErrSignature); event %+v", err, ev)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.want.DeliveryID = h.Get("X-GitHub-Delivery")
			if c.want.Repository.FullName() != "/" {
				c.want.Repository.ForgeID = githubtest.RepoID(c.want.Repository.FullName())
			}
			if ev != c.want {
				t.Errorf("event\n %+v\nwant\n %+v", ev, c.want)
			}
		})
	}
}

func TestGitHubStatuses(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	ctx := context.Background()
	repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
	long := strings.Repeat("é", 200)
	for _, s := range []Status{
		{Context: "harmonia-ci/nix-eval", State: StatePending, Description: "queued", TargetURL: "https://ci.example.com/e/1"},
		{Context: "harmonia-ci/nix-eval", State: StateSuccess, Description: long, TargetURL: "https://ci.example.com/e/1"},
		{Context: "harmonia-ci/nix-build", State: StatePending, Description: "0/3 builds complete"},
	} {
		if err := b.gh.ReportStatus(ctx, repo, ghSHA1, s); err != nil {
			t.Fatalf("ReportStatus %+v: %v", s, err)
		}
	}
	got := b.srv.Statuses("octo/one", ghSHA1)
	if len(got) != 3 || got[0].State != "pending" || got[1].State != "success" || got[2].Context != "harmonia-ci/nix-build" ||
		got[0].TargetURL != "https://ci.example.com/e/1" || got[2].TargetURL != "" {
		t.Fatalf("posted %+v", got)
	}
	if d := []rune(got[1].Description); len(d) != 140 || d[139] != '…' {
		t.Errorf("long description posted as %d characters %q", len(d), got[1].Description)
	}

	for _, c := range []struct {
		context string
		want    Status
		ok      bool
	}{
		{"harmonia-ci/nix-eval", Status{Context: "harmonia-ci/nix-eval", State: StateSuccess, Description: got[1].Description, TargetURL: "https://ci.example.com/e/1"}, true},
		{"harmonia-ci/nix-build", Status{Context: "harmonia-ci/nix-build", State: StatePending, Description: "0/3 builds complete"}, true},
		{"other", Status{}, false},
	} {
		s, ok, err := b.gh.LatestStatus(ctx, repo, ghSHA1, c.context)
		if err != nil || ok != c.ok || s != c.want {
			t.Errorf("LatestStatus(%s) = %+v, %v, %v; want %+v, %v", c.context, s, ok, err, c.want, c.ok)
		}
	}

	for _, c := range []struct {
		name string
		sha  string
		s    Status
	}{
		{"short sha", "abc", Status{Context: "c", State: StateSuccess}},
		{"upper-case sha", strings.ToUpper("abcdef") + ghSHA1[6:], Status{Context: "c", State: StateSuccess}},
		{"bad state", ghSHA1, Status{Context: "c", State: "done"}},
	} {
		if err := b.gh.ReportStatus(ctx, repo, c.sha, c.s); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	if _, _, err := b.gh.LatestStatus(ctx, repo, "abc", "c"); err == nil {
		t.Error("LatestStatus of a short sha: no error")
	}
	if n := b.count("POST /repos/octo/one/statuses/abc"); n != 0 {
		t.Errorf("invalid statuses were sent (%d)", n)
	}
}

// LatestStatus reads pages until the context shows up, and no further.
func TestGitHubLatestStatusPages(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	ctx := context.Background()
	repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
	report := func(s Status) {
		t.Helper()
		if err := b.gh.ReportStatus(ctx, repo, ghSHA2, s); err != nil {
			t.Fatal(err)
		}
	}
	report(Status{Context: "old", State: StateFailure, Description: "first"})
	for range 150 {
		report(Status{Context: "busy", State: StatePending})
	}
	s, ok, err := b.gh.LatestStatus(ctx, repo, ghSHA2, "old")
	if err != nil || !ok || s.State != StateFailure || s.Description != "first" {
		t.Fatalf("LatestStatus(old) = %+v, %v, %v", s, ok, err)
	}
	list := "GET /repos/octo/one/commits/" + ghSHA2 + "/statuses"
	if n := b.count(list); n != 2 {
		t.Errorf("%d pages read for a status on page 2, want 2", n)
	}
	if _, ok, err := b.gh.LatestStatus(ctx, repo, ghSHA2, "busy"); err != nil || !ok {
		t.Fatalf("LatestStatus(busy): %v, %v", ok, err)
	}
	if n := b.count(list); n != 3 {
		t.Errorf("%d pages read in all, want 3 (the newest is on page 1)", n)
	}
}

// Trust is write access: GitHub answers the collaborator endpoint 204 for read and triage
// users too (and for organisation members through the base permission), so WriteAccess must
// ask for the role.
func TestGitHubWriteAccess(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	b.srv.AddCollaborator("octo/one", "alice")
	for login, role := range map[string]string{"root": "admin", "maint": "maintain", "triager": "triage", "reader": "read", "gone": "none"} {
		b.srv.SetPermission("octo/one", login, role)
	}
	ctx := context.Background()
	repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
	for _, c := range []struct {
		login        string
		collaborator bool // what GET .../collaborators/{u} says: any access
		want         bool
		wantErr      bool
	}{
		{"alice", true, true, false},
		{"Alice", true, true, false},
		{"root", true, true, false},
		{"maint", true, true, false},
		{"octo", true, true, false}, // the owner
		{"triager", true, false, false},
		{"reader", true, false, false},
		{"gone", false, false, false},
		{"bob", false, false, false},
		{"dependabot[bot]", false, false, false},
		{"alice_acme", false, false, false}, // an Enterprise managed user
		{"../../admin", false, false, true},
		{"-bob", false, false, true},
		{"bo--b", false, false, true},
		{"a%2Fb", false, false, true},
		{strings.Repeat("a", 40), false, false, true},
		{"", false, false, true},
	} {
		got, err := WriteAccess(ctx, b.gh, repo, c.login)
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("WriteAccess(%q) = %v, %v; want %v, error %v", c.login, got, err, c.want, c.wantErr)
		}
		if c.wantErr {
			continue
		}
		// The stand-in answers the collaborator endpoint as GitHub does: the old check
		// (204 means trusted) would have trusted read and triage users.
		code := http.StatusNoContent
		if _, err := b.gh.repoDo(ctx, repo, http.MethodGet, b.gh.repoURL(repo, nil, "collaborators", c.login), nil, nil); errors.Is(err, ErrNotFound) {
			code = http.StatusNotFound
		} else if err != nil {
			t.Fatalf("GET collaborators/%s: %v", c.login, err)
		}
		if want := map[bool]int{true: http.StatusNoContent, false: http.StatusNotFound}[c.collaborator]; code != want {
			t.Errorf("GET collaborators/%s = %d, want %d", c.login, code, want)
		}
	}
	for _, p := range b.sent() {
		if strings.Contains(p, "admin/") || strings.Contains(p, "%25") {
			t.Errorf("an invalid login reached GitHub: %s", p)
		}
	}
	if _, err := WriteAccess(ctx, b.gh, Repo{Owner: "..", Name: "one", InstallationID: 7}, "alice"); err == nil {
		t.Error("invalid owner: no error")
	}
}

func TestGitHubPullRequest(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	b.srv.SetPullRequest("octo/one", githubtest.PR{Number: 1, User: "alice", HeadSHA: ghSHA1, HeadRef: "feature"})
	b.srv.SetPullRequest("octo/one", githubtest.PR{Number: 2, User: "mallory", HeadSHA: ghSHA2, HeadRef: "main", HeadRepo: "mallory/one", BaseRef: "dev"})
	b.srv.SetPullRequest("octo/one", githubtest.PR{Number: 3, User: "eve", HeadSHA: ghSHA2, HeadRef: "x", HeadRepoDeleted: true, State: "closed"})
	ctx := context.Background()
	repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
	for _, c := range []struct {
		n    int
		want PullRequest
	}{
		{1, PullRequest{Number: 1, HeadSHA: ghSHA1, HeadBranch: "feature", BaseBranch: "main", Author: "alice", AuthorID: b.srv.UserID("alice"), State: "open"}},
		{2, PullRequest{Number: 2, HeadSHA: ghSHA2, HeadBranch: "main", BaseBranch: "dev", Author: "mallory", AuthorID: b.srv.UserID("mallory"), Fork: true, State: "open"}},
		{3, PullRequest{Number: 3, HeadSHA: ghSHA2, HeadBranch: "x", BaseBranch: "main", Author: "eve", AuthorID: b.srv.UserID("eve"), Fork: true, State: "closed"}},
	} {
		got, err := b.gh.PullRequest(ctx, repo, c.n)
		if err != nil || got != c.want {
			t.Errorf("PullRequest(%d) = %+v, %v; want %+v", c.n, got, err, c.want)
		}
	}
	if _, err := b.gh.PullRequest(ctx, repo, 4); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing pull request: %v, want ErrNotFound", err)
	}
	if _, err := b.gh.PullRequest(ctx, repo, 0); err == nil {
		t.Error("pull request 0: no error")
	}
}

func TestGitHubBranchHead(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	b.srv.SetBranch("octo/one", "main", ghSHA1)
	b.srv.SetBranch("octo/one", "release/2.0#x", ghSHA2)
	ctx := context.Background()
	repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
	for _, c := range []struct {
		branch, want string
	}{{"main", ghSHA1}, {"release/2.0#x", ghSHA2}} {
		if got, err := b.gh.BranchHead(ctx, repo, c.branch); err != nil || got != c.want {
			t.Errorf("BranchHead(%s) = %q, %v; want %q", c.branch, got, err, c.want)
		}
	}
	if !slices.Contains(b.sent(), "GET /repos/octo/one/branches/release%2F2.0%23x") {
		t.Errorf("branch not sent as one escaped segment: %v", b.sent())
	}
	if _, err := b.gh.BranchHead(ctx, repo, "gone"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing branch: %v, want ErrNotFound", err)
	}
	if _, err := b.gh.BranchHead(ctx, repo, "../x"); err == nil {
		t.Error("invalid branch: no error")
	}
}

// A secondary rate limit is waited out for real: the one test that sleeps, for GitHub's
// smallest Retry-After.
func TestGitHubSecondaryRateLimitWait(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	b.srv.SetBranch("octo/one", "main", ghSHA1)
	ctx := context.Background()
	repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
	if _, err := b.gh.BranchHead(ctx, repo, "main"); err != nil { // the token exchange is not limited
		t.Fatal(err)
	}
	b.srv.RateLimitNext(1, time.Second)
	start := time.Now()
	if _, err := b.gh.BranchHead(ctx, repo, "main"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("call took %s, want at least the advertised 1s", d)
	}
	if n := b.count("GET /repos/octo/one/branches/main"); n != 3 {
		t.Errorf("%d branch requests, want 3 (one call, then a limited one retried once)", n)
	}
}

func TestGitHubRateLimitSleep(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		limit func(*githubtest.Server) time.Duration // queues a limit, returns the wait it asks for
	}{
		{"secondary", func(s *githubtest.Server) time.Duration { s.RateLimitNext(1, 30*time.Second); return 30 * time.Second }},
		{"primary", func(s *githubtest.Server) time.Duration {
			reset := time.Now().Add(90 * time.Second)
			s.PrimaryRateLimitNext(1, reset)
			return time.Until(reset)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setupGitHub(t)
			b.srv.SetBranch("octo/one", "main", ghSHA1)
			var sleeps []time.Duration
			b.gh.api.sleep = func(_ context.Context, d time.Duration) error { sleeps = append(sleeps, d); return nil }
			repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
			want := c.limit(b.srv)
			if sha, err := b.gh.BranchHead(context.Background(), repo, "main"); err != nil || sha != ghSHA1 {
				t.Fatalf("BranchHead = %q, %v", sha, err)
			}
			// The limit hit the token exchange, the first call; it was retried once.
			if len(sleeps) != 1 || sleeps[0] > want || sleeps[0] < want-2*time.Second {
				t.Errorf("slept %v, want one wait of about %s", sleeps, want)
			}
			if n := b.count("POST /app/installations/7/access_tokens"); n != 2 {
				t.Errorf("%d token requests, want 2", n)
			}
			if n := b.srv.TokenExchanges(); n != 1 {
				t.Errorf("%d tokens issued, want 1", n)
			}
		})
	}
}

func TestGitHubWebhookNoop(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
	id, err := b.gh.RegisterWebhook(context.Background(), repo, "https://ci.example.com/webhook/gh")
	if id != "" || err != nil {
		t.Errorf("RegisterWebhook = %q, %v", id, err)
	}
	if err := b.gh.DeleteWebhook(context.Background(), repo, ""); err != nil {
		t.Errorf("DeleteWebhook: %v", err)
	}
	if r := b.srv.Requests(); len(r) != 0 {
		t.Errorf("requests %v, want none", r)
	}
}

// The forge receives a delivery the stand-in makes over HTTP, as a frontend's handler would.
func TestGitHubDelivery(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	got := make(chan Event, 1)
	hook := http.NewServeMux()
	hook.HandleFunc("POST /webhook/gh", func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		body.ReadFrom(r.Body)
		if err := VerifyWebhook(b.gh, r.Header, 0, body.Bytes()); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		ev, err := b.gh.ParseWebhook(r.Header, body.Bytes())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got <- ev
		w.WriteHeader(http.StatusAccepted)
	})
	srv := httptest.NewServer(hook)
	t.Cleanup(srv.Close)
	payload := githubtest.PushPayload(githubtest.Push{Repo: ghRepoOne, Ref: "refs/heads/main", After: ghSHA1, Sender: "alice", Installation: 7})
	resp, err := b.srv.Deliver(context.Background(), srv.URL+"/webhook/gh", "push", payload)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("delivery answered %d", resp.StatusCode)
	}
	ev := <-got
	if ev.Kind != EventPush || ev.After != ghSHA1 || ev.Repository.InstallationID != 7 || ev.DeliveryID == "" {
		t.Errorf("event %+v", ev)
	}
}

func TestValidGitHubLogin(t *testing.T) {
	t.Parallel()
	for login, ok := range map[string]bool{
		"a": true, "octo-cat": true, "Octo1": true, "dependabot[bot]": true, "jdoe_acme": true,
		strings.Repeat("a", 39): true, strings.Repeat("a", 40): false,
		"": false, "-a": false, "a--b": false, "a.b": false, "a/b": false, "a b": false, "[bot]": false,
		"a_": false, "a_b_c": false, "a[bot]x": false, "é": false,
	} {
		if err := validGitHubLogin(login); (err == nil) != ok {
			t.Errorf("validGitHubLogin(%q) = %v, want ok %v", login, err, ok)
		}
	}
}

func TestGitHubPullRequestCommits(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	var commits []githubtest.Commit
	for i := range 120 {
		commits = append(commits, githubtest.Commit{SHA: fmt.Sprintf("%040x", i+1), Date: githubtest.PRCreatedAt.Add(time.Duration(i) * time.Minute)})
	}
	b.srv.SetPullRequest("octo/one", githubtest.PR{Number: 4, User: "alice", HeadSHA: commits[119].SHA, HeadRef: "f", Commits: commits})
	ctx := context.Background()
	repo := Repo{Owner: "octo", Name: "one", InstallationID: 7}
	got, err := b.gh.PullRequestCommits(ctx, repo, 4)
	if err != nil || len(got) != len(commits) {
		t.Fatalf("PullRequestCommits = %d commits, %v; want %d", len(got), err, len(commits))
	}
	for i, c := range got {
		if c.SHA != commits[i].SHA || !c.Time.Equal(commits[i].Date) {
			t.Fatalf("commit %d = %+v, want %+v (oldest first)", i, c, commits[i])
		}
	}
	if n := b.count("GET /repos/octo/one/pulls/4/commits"); n != 2 {
		t.Errorf("%d pages read, want 2", n)
	}
	if _, err := b.gh.PullRequestCommits(ctx, repo, 5); !errors.Is(err, ErrNotFound) {
		t.Errorf("commits of a missing pull request: %v, want ErrNotFound", err)
	}
	if _, err := b.gh.PullRequestCommits(ctx, repo, 0); err == nil {
		t.Error("pull request 0: no error")
	}
}
