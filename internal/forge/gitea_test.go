package forge

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// recordedRepoID is the forge id of the repository of the recorded deliveries.
const recordedRepoID = 1

// giteaDelivery reads a delivery a real Gitea 1.26 sent (recorded by internal/giteatest) and
// re-signs it with the recorded repository's secret under the forge's secret.
func giteaDelivery(t *testing.T, name string, secret []byte, edit func(string) string) (http.Header, []byte) {
	t.Helper()
	dir := filepath.Join("..", "giteatest", "testdata")
	body, err := os.ReadFile(filepath.Join(dir, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		body = []byte(edit(string(body)))
	}
	raw, err := os.ReadFile(filepath.Join(dir, name+".headers"))
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ": ")
		if ok {
			h.Set(k, v)
		}
	}
	h.Set("X-Gitea-Signature", Sign(RepositorySecret(secret, recordedRepoID), body))
	return h, body
}

func newTestGitea(t *testing.T, secret []byte) *Gitea {
	t.Helper()
	g, err := NewGitea(GiteaConfig{Name: "gitea", URL: "http://gitea.example", Token: "tok", WebhookSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestGiteaVerifyWebhook(t *testing.T) {
	secret := []byte("s3cret")
	g := newTestGitea(t, secret)
	h, body := giteaDelivery(t, "push", secret, nil)
	if err := VerifyWebhook(g, h, recordedRepoID, body); err != nil {
		t.Fatalf("a correctly signed delivery: %v", err)
	}
	tests := []struct {
		name   string
		edit   func(h http.Header, body []byte) (http.Header, []byte)
		repoID int64 // the repository the URL names; 0: recordedRepoID
	}{
		{name: "another repository's secret", edit: func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set("X-Gitea-Signature", Sign(RepositorySecret(secret, recordedRepoID+1), b))
			return h, b
		}},
		{name: "at another repository's URL", edit: func(h http.Header, b []byte) (http.Header, []byte) { return h, b },
			repoID: recordedRepoID + 1},
		{name: "the forge-wide secret", edit: func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set("X-Gitea-Signature", Sign(secret, b))
			return h, b
		}},
		{name: "at the forge-wide URL", edit: func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set("X-Gitea-Signature", Sign(secret, b))
			return h, b
		}, repoID: -1},
		{name: "missing", edit: func(h http.Header, b []byte) (http.Header, []byte) { h.Del("X-Gitea-Signature"); return h, b }},
		{name: "wrong secret", edit: func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set("X-Gitea-Signature", Sign([]byte("other"), b))
			return h, b
		}},
		{name: "tampered body", edit: func(h http.Header, b []byte) (http.Header, []byte) {
			return h, bytes.Replace(b, []byte("refs/heads/main"), []byte("refs/heads/evil"), 1)
		}},
		{name: "not hex", edit: func(h http.Header, b []byte) (http.Header, []byte) { h.Set("X-Gitea-Signature", "zz"); return h, b }},
		{name: "only the GitHub-style header", edit: func(h http.Header, b []byte) (http.Header, []byte) {
			h.Set("X-Hub-Signature-256", "sha256="+h.Get("X-Gitea-Signature"))
			h.Del("X-Gitea-Signature")
			return h, b
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, body := giteaDelivery(t, "push", secret, nil)
			h, body = tc.edit(h, body)
			repoID := cmp.Or(tc.repoID, recordedRepoID)
			if repoID < 0 {
				repoID = 0
			}
			if err := VerifyWebhook(g, h, int64(repoID), body); !errors.Is(err, ErrSignature) {
				t.Fatalf("err = %v, want ErrSignature", err)
			}
		})
	}
	if _, err := NewGitea(GiteaConfig{Name: "g", URL: "http://x", Token: "t"}); err == nil {
		t.Fatal("a Gitea forge without a webhook secret was accepted")
	}
}

func TestGiteaParseWebhook(t *testing.T) {
	secret := []byte("s3cret")
	g := newTestGitea(t, secret)
	repo := Repository{Repo: Repo{Owner: "owner1", Name: "hooked"}, CloneURL: "http://127.0.0.1:44515/owner1/hooked.git", DefaultBranch: "main"}
	const (
		head1 = "381460ba4a30beb2adcba1d91adc415169a6c29c"
		head2 = "2d6cb4e1d44d9ce843de214751594d48093c8e98"
	)
	tests := []struct {
		name    string
		file    string
		edit    func(string) string
		want    Event
		wantErr bool
	}{
		{name: "push", file: "push", want: Event{Kind: EventPush, Type: "push", Repository: repo, Sender: "owner1", SenderID: 2,
			Branch: "main", After: "7b68be0087a1a5d2e161d91bd9e9dfc23b26e09a"}},
		{name: "tag push", file: "push", edit: func(s string) string { return strings.Replace(s, "refs/heads/main", "refs/tags/v1", 1) },
			want: Event{Kind: EventIgnored, Type: "push", Repository: repo, Sender: "owner1", SenderID: 2}},
		{name: "branch deleted", file: "push", edit: func(s string) string {
			return strings.Replace(s, `"after": "7b68be0087a1a5d2e161d91bd9e9dfc23b26e09a"`, `"after": "0000000000000000000000000000000000000000"`, 1)
		}, want: Event{Kind: EventIgnored, Type: "push", Repository: repo, Sender: "owner1", SenderID: 2}},
		{name: "pull request opened", file: "pull_request", want: Event{Kind: EventPullRequest, Type: "pull_request", Action: "opened",
			Repository: repo, Sender: "contrib2", SenderID: 3, PullRequest: PullRequest{Number: 1, HeadSHA: head1, HeadBranch: "feature",
				BaseBranch: "main", Author: "contrib2", AuthorID: 3, Fork: true, State: "open"}}},
		{name: "pull request pushed to", file: "pull_request_synchronized", want: Event{Kind: EventPullRequest, Type: "pull_request",
			Action: "synchronized", Repository: repo, Sender: "contrib2", SenderID: 3, PullRequest: PullRequest{Number: 1, HeadSHA: head2,
				HeadBranch: "feature", BaseBranch: "main", Author: "contrib2", AuthorID: 3, Fork: true, State: "open"}}},
		{name: "pull request closed", file: "pull_request", edit: func(s string) string {
			return strings.Replace(s, `"action": "opened"`, `"action": "closed"`, 1)
		}, want: Event{Kind: EventIgnored, Type: "pull_request", Action: "closed", Repository: repo, Sender: "contrib2", SenderID: 3}},
		// The pull request as it was when the comment was made comes with it.
		{name: "comment on a pull request", file: "pull_request_comment", want: Event{Kind: EventComment, Type: "issue_comment",
			Action: "created", Repository: repo, Sender: "contrib2", SenderID: 3, PullRequest: PullRequest{Number: 1, HeadSHA: head2,
				HeadBranch: "feature", BaseBranch: "main", Author: "contrib2", AuthorID: 3, Fork: true, State: "open"},
			Commenter: "contrib2", Body: "please build", CommentedAt: time.Date(2026, 11, 26, 0, 27, 50, 0, time.UTC)}},
		{name: "comment edited", file: "pull_request_comment", edit: func(s string) string {
			return strings.Replace(s, `"action": "created"`, `"action": "edited"`, 1)
		}, want: Event{Kind: EventIgnored, Type: "issue_comment", Action: "edited", Repository: repo, Sender: "contrib2", SenderID: 3}},
		{name: "comment on an issue", file: "pull_request_comment", edit: func(s string) string {
			s = strings.Replace(s, `"is_pull": true`, `"is_pull": false`, 1)
			return strings.Replace(s, `"pull_request": {`, `"pull_request_x": {`, 1)
		}, want: Event{Kind: EventIgnored, Type: "issue_comment", Action: "created", Repository: repo, Sender: "contrib2", SenderID: 3}},
		{name: "malformed", file: "push", edit: func(s string) string { return s[:len(s)/2] }, wantErr: true},
		{name: "bad commit id", file: "push", edit: func(s string) string {
			return strings.Replace(s, `"after": "7b68be0087a1a5d2e161d91bd9e9dfc23b26e09a"`, `"after": "--upload-pack=x"`, 1)
		}, wantErr: true},
		{name: "bad repository name", file: "push", edit: func(s string) string {
			return strings.Replace(s, `"full_name": "owner1/hooked"`, `"full_name": "owner1/../x"`, 1)
		}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, body := giteaDelivery(t, tc.file, secret, tc.edit)
			if err := VerifyWebhook(g, h, recordedRepoID, body); err != nil {
				t.Fatal(err)
			}
			ev, err := g.ParseWebhook(h, body)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("no error; event %+v", ev)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.want.DeliveryID = h.Get("X-Gitea-Delivery")
			if tc.want.Repository.FullName() != "/" {
				tc.want.Repository.ForgeID = recordedRepoID
			}
			if ev != tc.want {
				t.Errorf("event\n %+v\nwant\n %+v", ev, tc.want)
			}
		})
	}
}
