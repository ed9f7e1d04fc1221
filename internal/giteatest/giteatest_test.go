package giteatest_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

var update = flag.Bool("update", false, "rewrite testdata/ with the webhook deliveries received")

func TestMain(m *testing.M) { os.Exit(giteatest.Main(m)) }

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// must(f())(t) is f's value, failing t if f returned an error.
func must[T any](v T, err error) func(testing.TB) T {
	return func(t testing.TB) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestStartStop(t *testing.T) {
	giteatest.Need(t)
	t.Parallel()
	start := time.Now()
	s, err := giteatest.Start(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Start took %v", time.Since(start))
	stopped := false
	defer func() {
		if !stopped {
			s.Stop()
		}
	}()
	var me struct {
		Login   string `json:"login"`
		IsAdmin bool   `json:"is_admin"`
	}
	if err := s.Do(ctxFor(t), s.AdminToken, http.MethodGet, "/user", nil, &me); err != nil {
		t.Fatal(err)
	}
	if me.Login != giteatest.AdminLogin || !me.IsAdmin || s.Admin.Token != s.AdminToken {
		t.Fatalf("token's user = %+v, want the administrator", me)
	}
	if os.Geteuid() == 0 {
		fi := must(os.Stat(s.Dir))(t)
		if fi.Sys().(*syscall.Stat_t).Uid == 0 {
			t.Errorf("%s is owned by root; want the gitea user", s.Dir)
		}
	}
	s.Stop()
	stopped = true
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("Stop left %s: %v", s.Dir, err)
	}
	resp, err := http.Get(s.URL + "/api/v1/version")
	if err == nil {
		resp.Body.Close()
		t.Errorf("the server still answers after Stop")
	}
}

// commitParents returns the parents of commit sha.
func commitParents(t *testing.T, s *giteatest.Server, repo giteatest.Repo, sha string) []string {
	t.Helper()
	var c struct {
		Parents []struct {
			SHA string `json:"sha"`
		} `json:"parents"`
	}
	if err := s.Do(ctxFor(t), s.AdminToken, http.MethodGet, "/repos/"+repo.FullName()+"/git/commits/"+sha, nil, &c); err != nil {
		t.Fatal(err)
	}
	var ps []string
	for _, p := range c.Parents {
		ps = append(ps, p.SHA)
	}
	return ps
}

func TestForge(t *testing.T) {
	s := giteatest.Shared(t)
	t.Parallel()
	ctx := ctxFor(t)
	alice := must(s.CreateUser(ctx, giteatest.UniqueName("alice")))(t)
	bob := must(s.CreateUser(ctx, giteatest.UniqueName("bob")))(t)
	mallory := must(s.CreateUser(ctx, giteatest.UniqueName("mallory")))(t)

	repo := must(s.CreateRepo(ctx, alice, "proj", true))(t)
	if repo.Owner != alice.Login || repo.Name != "proj" || !repo.Private || repo.DefaultBranch != "main" ||
		repo.CloneURL != s.URL+"/"+alice.Login+"/proj.git" || repo.HTMLURL != s.URL+"/"+alice.Login+"/proj" {
		t.Fatalf("CreateRepo = %+v", repo)
	}
	if _, err := s.BranchHead(ctx, repo, "main"); !giteatest.IsNotFound(err) {
		t.Fatalf("BranchHead of an empty repository: %v, want a 404", err)
	}

	// Pushes: a root commit, one on top, then a force-push replacing it.
	sha1 := must(s.Push(ctx, repo, alice, "main", map[string]string{"default.nix": "1", "dir/a": "a"}, "first", false))(t)
	sha2 := must(s.Push(ctx, repo, alice, "main", map[string]string{"default.nix": "2"}, "second", false))(t)
	if ps := commitParents(t, s, repo, sha2); len(ps) != 1 || ps[0] != sha1 {
		t.Errorf("parents of the second commit = %v, want [%s]", ps, sha1)
	}
	sha3 := must(s.Push(ctx, repo, alice, "main", map[string]string{"default.nix": "3"}, "second, amended", true))(t)
	if sha3 == sha2 {
		t.Fatal("the force-push did not change the head")
	}
	if ps := commitParents(t, s, repo, sha3); len(ps) != 1 || ps[0] != sha1 {
		t.Errorf("parents of the amended commit = %v, want [%s]", ps, sha1)
	}
	if head := must(s.BranchHead(ctx, repo, "main"))(t); head != sha3 {
		t.Errorf("BranchHead(main) = %s, want %s", head, sha3)
	}
	// A new branch, force or not, starts from nothing.
	other := must(s.Push(ctx, repo, alice, "other", map[string]string{"x": "x"}, "other root", true))(t)
	if ps := commitParents(t, s, repo, other); len(ps) != 0 {
		t.Errorf("parents of a new branch's commit = %v, want none", ps)
	}

	// Collaborators: the check answers 204 or 404.
	if err := s.AddCollaborator(ctx, repo, bob.Login, "write"); err != nil {
		t.Fatal(err)
	}
	collab := func(login string) int {
		err := s.Do(ctx, s.AdminToken, http.MethodGet, "/repos/"+repo.FullName()+"/collaborators/"+login, nil, nil)
		if err == nil {
			return http.StatusNoContent
		}
		if giteatest.IsNotFound(err) {
			return http.StatusNotFound
		}
		t.Fatal(err)
		return 0
	}
	if c := collab(bob.Login); c != http.StatusNoContent {
		t.Errorf("collaborator check for bob = %d, want 204", c)
	}
	if c := collab(mallory.Login); c != http.StatusNotFound {
		t.Errorf("collaborator check for mallory = %d, want 404", c)
	}
	// The owner is not a collaborator (Gitea checks its collaboration table only).
	if c := collab(alice.Login); c != http.StatusNotFound {
		t.Errorf("collaborator check for the owner = %d, want 404", c)
	}
	err := s.Do(ctx, s.AdminToken, http.MethodGet, "/repos/"+repo.FullName()+"/collaborators/nobody-at-all", nil, nil)
	t.Logf("collaborator check for an unknown user: %v", err)
	for _, u := range []giteatest.User{alice, bob, mallory} {
		var p struct {
			Permission string `json:"permission"`
			RoleName   string `json:"role_name"`
		}
		err := s.Do(ctx, s.AdminToken, http.MethodGet, "/repos/"+repo.FullName()+"/collaborators/"+u.Login+"/permission", nil, &p)
		t.Logf("permission of %s: %+v %v", u.Login, p, err)
	}
	// bob can push now.
	must(s.Push(ctx, repo, bob, "bob-branch", map[string]string{"b": "b"}, "by bob", false))(t)

	// A pull request from a fork by a non-collaborator, and a comment on it. The repository is
	// private: mallory needs read access to fork it.
	if err := s.AddCollaborator(ctx, repo, mallory.Login, "read"); err != nil {
		t.Fatal(err)
	}
	fork := must(s.Fork(ctx, repo, mallory))(t)
	if fork.Owner != mallory.Login || fork.Name != "proj" {
		t.Fatalf("Fork = %+v", fork)
	}
	prSHA := must(s.Push(ctx, fork, mallory, "feature", map[string]string{"evil": "1"}, "feature", false))(t)
	n := must(s.CreatePullRequest(ctx, mallory, repo, "main", fork, "feature", "a feature"))(t)
	var pr struct {
		Head struct {
			SHA  string `json:"sha"`
			Ref  string `json:"ref"`
			Repo struct {
				FullName string `json:"full_name"`
			} `json:"repo"`
		} `json:"head"`
		User struct {
			Login string `json:"login"`
		} `json:"user"`
	}
	if err := s.Do(ctx, s.AdminToken, http.MethodGet, "/repos/"+repo.FullName()+"/pulls/"+itoa(n), nil, &pr); err != nil {
		t.Fatal(err)
	}
	if pr.Head.SHA != prSHA || pr.Head.Ref != "feature" || pr.Head.Repo.FullName != fork.FullName() || pr.User.Login != mallory.Login {
		t.Errorf("pull request %d = %+v, want head %s feature of %s by %s", n, pr, prSHA, fork.FullName(), mallory.Login)
	}
	if err := s.Comment(ctx, repo, mallory, n, "hello"); err != nil {
		t.Fatal(err)
	}
	// Removing mallory's read access: a fork's pull request stays.
	if err := s.Do(ctx, s.AdminToken, http.MethodDelete, "/repos/"+repo.FullName()+"/collaborators/"+mallory.Login, nil, nil); err != nil {
		t.Fatal(err)
	}

	// Commit statuses: every one is kept, in the order posted.
	posts := []giteatest.Status{
		{Context: "ci/a", State: "pending", Description: "queued", TargetURL: "http://ci.invalid/1"},
		{Context: "ci/a", State: "success", Description: "built", TargetURL: "http://ci.invalid/1"},
		{Context: "ci/b", State: "failure", Description: "failed", TargetURL: "http://ci.invalid/2"},
	}
	for _, p := range posts {
		err := s.Do(ctx, alice.Token, http.MethodPost, "/repos/"+repo.FullName()+"/statuses/"+sha3, map[string]string{
			"context": p.Context, "state": p.State, "description": p.Description, "target_url": p.TargetURL,
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	st := must(s.Statuses(ctx, repo, sha3))(t)
	if len(st) != len(posts) {
		t.Fatalf("Statuses = %+v, want %d", st, len(posts))
	}
	for i, p := range posts {
		got := st[i]
		if got.ID == 0 || got.Context != p.Context || got.State != p.State || got.Description != p.Description || got.TargetURL != p.TargetURL {
			t.Errorf("status %d = %+v, want %+v", i, got, p)
		}
	}
	if st := must(s.Statuses(ctx, repo, sha1))(t); len(st) != 0 {
		t.Errorf("Statuses of an unmarked commit = %+v", st)
	}

	// Webhooks created through the API are listed by Hooks.
	var created struct {
		ID int64 `json:"id"`
	}
	err = s.Do(ctx, alice.Token, http.MethodPost, "/repos/"+repo.FullName()+"/hooks", map[string]any{
		"type": "gitea", "active": true, "events": []string{"push", "pull_request"},
		"config": map[string]string{"url": "http://127.0.0.1:9/hook", "content_type": "json", "secret": "s3cret"},
	}, &created)
	if err != nil {
		t.Fatal(err)
	}
	hooks := must(s.Hooks(ctx, repo))(t)
	// Gitea lists "pull_request" expanded into the events it covers (pull_request_sync,
	// pull_request_comment, ...), in no fixed order.
	if len(hooks) != 1 || hooks[0].ID != created.ID || hooks[0].URL != "http://127.0.0.1:9/hook" || !hooks[0].Active ||
		!slices.Contains(hooks[0].Events, "push") || !slices.Contains(hooks[0].Events, "pull_request") {
		t.Fatalf("Hooks = %+v, want the hook %d", hooks, created.ID)
	}
	if err := s.Do(ctx, alice.Token, http.MethodDelete, "/repos/"+repo.FullName()+"/hooks/"+itoa(int(created.ID)), nil, nil); err != nil {
		t.Fatal(err)
	}
	if hooks := must(s.Hooks(ctx, repo))(t); len(hooks) != 0 {
		t.Fatalf("Hooks after delete = %+v", hooks)
	}

	// A user's repositories, paginated.
	for i := 0; i < 3; i++ {
		must(s.CreateRepo(ctx, bob, giteatest.UniqueName("r"), false))(t)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/v1/user/repos?limit=2&page=1", nil)
	req.Header.Set("Authorization", "token "+bob.Token)
	resp := must(http.DefaultClient.Do(req))(t)
	resp.Body.Close()
	t.Logf("GET /user/repos?limit=2: X-Total-Count=%q Link=%q", resp.Header.Get("X-Total-Count"), resp.Header.Get("Link"))
	if resp.Header.Get("X-Total-Count") != "4" || !strings.Contains(resp.Header.Get("Link"), `rel="next"`) {
		t.Errorf("pagination headers: X-Total-Count=%q Link=%q", resp.Header.Get("X-Total-Count"), resp.Header.Get("Link"))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func jsonString(v any) string { b, _ := json.Marshal(v); return string(b) }

// delivery is one webhook request received.
type delivery struct {
	hook   string // the path it was sent to
	header http.Header
	body   []byte
}

type receiver struct {
	mu  sync.Mutex
	got []delivery
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.got = append(r.got, delivery{hook: req.URL.Path, header: req.Header.Clone(), body: b})
	r.mu.Unlock()
}

// find returns the deliveries to hook of event type eventType.
func (r *receiver) find(hook, eventType string) []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ds []delivery
	for _, d := range r.got {
		if d.hook == hook && d.header.Get("X-Gitea-Event-Type") == eventType {
			ds = append(ds, d)
		}
	}
	return ds
}

// wait waits for a delivery to hook of eventType for which match holds.
func (r *receiver) wait(t *testing.T, hook, eventType string, match func(map[string]any) bool) delivery {
	t.Helper()
	var found delivery
	waittest.For(t, 30*time.Second, func() bool {
		for _, d := range r.find(hook, eventType) {
			var m map[string]any
			if json.Unmarshal(d.body, &m) == nil && match(m) {
				found = d
				return true
			}
		}
		return false
	}, "a %s delivery to %s", eventType, hook)
	return found
}

// field returns the value at a dotted path of a decoded JSON object.
func field(m map[string]any, path string) any {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		o, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = o[k]
	}
	return v
}

const secret = "hook-secret"

func checkDelivery(t *testing.T, d delivery, event, eventType string, fields map[string]any) {
	t.Helper()
	if g := d.header.Get("X-Gitea-Event"); g != event {
		t.Errorf("%s: X-Gitea-Event = %q, want %q", eventType, g, event)
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(d.body)
	if g, want := d.header.Get("X-Gitea-Signature"), hex.EncodeToString(mac.Sum(nil)); g != want {
		t.Errorf("%s: X-Gitea-Signature = %q, want HMAC-SHA256 of the body %q", eventType, g, want)
	}
	if d.header.Get("X-Gitea-Delivery") == "" {
		t.Errorf("%s: no X-Gitea-Delivery", eventType)
	}
	var m map[string]any
	if err := json.Unmarshal(d.body, &m); err != nil {
		t.Fatal(err)
	}
	for path, want := range fields {
		if g := field(m, path); jsonString(g) != jsonString(want) {
			t.Errorf("%s: %s = %v, want %v", eventType, path, jsonString(g), jsonString(want))
		}
	}
	var names []string
	for k := range d.header {
		names = append(names, k+": "+strings.Join(d.header[k], ", "))
	}
	sort.Strings(names)
	t.Logf("%s headers:\n  %s", eventType, strings.Join(names, "\n  "))
}

func saveFixture(t *testing.T, name string, d delivery) {
	t.Helper()
	if !*update {
		return
	}
	var pretty map[string]any
	if err := json.Unmarshal(d.body, &pretty); err != nil {
		t.Fatal(err)
	}
	var hs []string
	for k, vs := range d.header {
		for _, v := range vs {
			hs = append(hs, k+": "+v)
		}
	}
	sort.Strings(hs)
	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	// The body as delivered, byte for byte, so its signature in the headers holds.
	if err := os.WriteFile(filepath.Join("testdata", name+".json"), d.body, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("testdata", name+".headers"), []byte(strings.Join(hs, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestWebhookDelivery shows Gitea delivers webhooks to a loopback server, and what they hold.
func TestWebhookDelivery(t *testing.T) {
	s := giteatest.Shared(t)
	t.Parallel()
	ctx := ctxFor(t)
	rcv := &receiver{}
	hs := httptest.NewServer(rcv)
	defer hs.Close()

	owner := must(s.CreateUser(ctx, giteatest.UniqueName("owner")))(t)
	contrib := must(s.CreateUser(ctx, giteatest.UniqueName("contrib")))(t)
	repo := must(s.CreateRepo(ctx, owner, "hooked", false))(t)
	// Three hooks, to tell which event lists cover comments on pull requests.
	for path, events := range map[string][]string{
		"/all":                  {"push", "pull_request", "issue_comment"},
		"/issue_comment":        {"push", "issue_comment"},
		"/pull_request_comment": {"pull_request_comment"},
	} {
		err := s.Do(ctx, owner.Token, http.MethodPost, "/repos/"+repo.FullName()+"/hooks", map[string]any{
			"type": "gitea", "active": true, "events": events,
			"config": map[string]string{"url": hs.URL + path, "content_type": "json", "secret": secret},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}

	sha := must(s.Push(ctx, repo, owner, "main", map[string]string{"default.nix": "{}"}, "init", false))(t)
	d := rcv.wait(t, "/all", "push", func(m map[string]any) bool { return m["after"] == sha })
	checkDelivery(t, d, "push", "push", map[string]any{
		"ref": "refs/heads/main", "after": sha, "before": strings.Repeat("0", 40),
		"repository.full_name": repo.FullName(), "repository.clone_url": repo.CloneURL,
		"repository.default_branch": "main", "repository.private": false,
		"repository.owner.login": owner.Login, "repository.name": "hooked",
		"pusher.login": owner.Login, "sender.login": owner.Login,
	})
	saveFixture(t, "push", d)
	sha2 := must(s.Push(ctx, repo, owner, "main", map[string]string{"default.nix": "{ }"}, "again", true))(t)
	d = rcv.wait(t, "/all", "push", func(m map[string]any) bool { return m["after"] == sha2 })
	checkDelivery(t, d, "push", "push", map[string]any{"before": sha, "forced": nil})

	fork := must(s.Fork(ctx, repo, contrib))(t)
	head := must(s.Push(ctx, fork, contrib, "feature", map[string]string{"f": "1"}, "feature", false))(t)
	n := must(s.CreatePullRequest(ctx, contrib, repo, "main", fork, "feature", "feature"))(t)
	d = rcv.wait(t, "/all", "pull_request", func(m map[string]any) bool { return m["action"] == "opened" })
	checkDelivery(t, d, "pull_request", "pull_request", map[string]any{
		"action": "opened", "number": float64(n), "pull_request.number": float64(n),
		"pull_request.head.sha": head, "pull_request.head.ref": "feature",
		"pull_request.head.repo.full_name": fork.FullName(), "pull_request.base.ref": "main",
		"pull_request.base.repo.full_name": repo.FullName(), "pull_request.user.login": contrib.Login,
		"repository.full_name": repo.FullName(), "sender.login": contrib.Login,
	})
	saveFixture(t, "pull_request", d)

	head2 := must(s.Push(ctx, fork, contrib, "feature", map[string]string{"f": "2"}, "feature 2", false))(t)
	d = rcv.wait(t, "/all", "pull_request_sync", func(m map[string]any) bool { return field(m, "pull_request.head.sha") == head2 })
	checkDelivery(t, d, "pull_request", "pull_request_sync", map[string]any{
		"action": "synchronized", "number": float64(n), "pull_request.head.sha": head2,
	})
	saveFixture(t, "pull_request_synchronized", d)

	if err := s.Comment(ctx, repo, contrib, n, "please build"); err != nil {
		t.Fatal(err)
	}
	d = rcv.wait(t, "/all", "pull_request_comment", func(m map[string]any) bool { return field(m, "comment.body") == "please build" })
	checkDelivery(t, d, "issue_comment", "pull_request_comment", map[string]any{
		"action": "created", "issue.number": float64(n), "is_pull": true, "comment.body": "please build",
		"comment.user.login": contrib.Login, "sender.login": contrib.Login, "repository.full_name": repo.FullName(),
	})
	var m map[string]any
	_ = json.Unmarshal(d.body, &m)
	t.Logf("pull_request_comment: issue.pull_request = %s, keys %v", jsonString(field(m, "issue.pull_request")), keys(m))
	saveFixture(t, "pull_request_comment", d)
	rcv.wait(t, "/pull_request_comment", "pull_request_comment", func(m map[string]any) bool { return field(m, "comment.body") == "please build" })

	// A comment on an issue, for contrast: only the issue_comment lists get it.
	var issue struct {
		Number int `json:"number"`
	}
	if err := s.Do(ctx, contrib.Token, http.MethodPost, "/repos/"+repo.FullName()+"/issues", map[string]string{"title": "bug"}, &issue); err != nil {
		t.Fatal(err)
	}
	if err := s.Comment(ctx, repo, contrib, issue.Number, "on an issue"); err != nil {
		t.Fatal(err)
	}
	d = rcv.wait(t, "/issue_comment", "issue_comment", func(m map[string]any) bool { return field(m, "comment.body") == "on an issue" })
	checkDelivery(t, d, "issue_comment", "issue_comment", map[string]any{"is_pull": false, "issue.number": float64(issue.Number)})
	rcv.wait(t, "/all", "issue_comment", func(m map[string]any) bool { return field(m, "comment.body") == "on an issue" })
	// Deliveries of one event are prepared together: by now a PR comment would have reached the
	// issue_comment-only hook too (the window covers delivery lag).
	waittest.Hold(t, time.Second, func() {
		if ds := rcv.find("/issue_comment", "pull_request_comment"); len(ds) != 0 {
			t.Fatalf("a hook for [push issue_comment] got a pull request comment")
		}
		if ds := rcv.find("/pull_request_comment", "issue_comment"); len(ds) != 0 {
			t.Fatalf("a hook for [pull_request_comment] got an issue comment")
		}
	})
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
