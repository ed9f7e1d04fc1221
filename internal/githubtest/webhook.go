package githubtest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// hookshotVersion stands in for the commit GitHub's webhook sender names in its User-Agent.
const hookshotVersion = "GitHub-Hookshot/8e4b2c1"

// WebhookHeader is the header GitHub sends with an App's delivery of body as event: event and
// delivery id, both signatures (sha1 and sha256 HMACs under WebhookSecret), User-Agent and
// Content-Type.
func (s *Server) WebhookHeader(event string, body []byte) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", hookshotVersion)
	h.Set("X-GitHub-Event", event)
	h.Set("X-GitHub-Delivery", uuid.NewString())
	h.Set("X-GitHub-Hook-ID", strconv.FormatInt(numericID("hook"), 10))
	h.Set("X-GitHub-Hook-Installation-Target-Type", "integration")
	h.Set("X-GitHub-Hook-Installation-Target-ID", strconv.FormatInt(s.AppID, 10))
	sig1 := hmac.New(sha1.New, s.WebhookSecret)
	sig1.Write(body)
	h.Set("X-Hub-Signature", "sha1="+hex.EncodeToString(sig1.Sum(nil)))
	sig256 := hmac.New(sha256.New, s.WebhookSecret)
	sig256.Write(body)
	h.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(sig256.Sum(nil)))
	return h
}

// Deliver POSTs payload (JSON-encoded; a []byte is sent as it is) to url as GitHub delivers an
// event to an App's webhook URL. The caller closes the response body.
func (s *Server) Deliver(ctx context.Context, url, event string, payload any) (*http.Response, error) {
	body, ok := payload.([]byte)
	if !ok {
		var err error
		if body, err = json.Marshal(payload); err != nil {
			return nil, fmt.Errorf("encode %s payload: %w", event, err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = s.WebhookHeader(event, body)
	return http.DefaultClient.Do(req)
}

func userJSON(login string) map[string]any {
	typ := "User"
	if strings.HasSuffix(login, "[bot]") {
		typ = "Bot"
	}
	return map[string]any{
		"login":      login,
		"id":         numericID(login),
		"node_id":    "U_" + strconv.FormatInt(numericID(login), 36),
		"avatar_url": fmt.Sprintf("https://avatars.githubusercontent.com/u/%d?v=4", numericID(login)),
		"url":        "https://api.github.com/users/" + login,
		"html_url":   "https://github.com/" + login,
		"type":       typ,
		"site_admin": false,
	}
}

// RepoJSON is a repository as the REST API and most webhook payloads show it.
func RepoJSON(r Repo) map[string]any {
	owner, name, _ := strings.Cut(r.FullName, "/")
	visibility := "public"
	if r.Private {
		visibility = "private"
	}
	return map[string]any{
		"id":             numericID(r.FullName),
		"node_id":        "R_" + strconv.FormatInt(numericID(r.FullName), 36),
		"name":           name,
		"full_name":      r.FullName,
		"private":        r.Private,
		"visibility":     visibility,
		"owner":          userJSON(owner),
		"html_url":       "https://github.com/" + r.FullName,
		"description":    nil,
		"fork":           false,
		"url":            "https://api.github.com/repos/" + r.FullName,
		"git_url":        "git://github.com/" + r.FullName + ".git",
		"ssh_url":        "git@github.com:" + r.FullName + ".git",
		"clone_url":      cmpOr(r.CloneURL, "https://github.com/"+r.FullName+".git"),
		"default_branch": cmpOr(r.DefaultBranch, "main"),
		"archived":       false,
		"disabled":       false,
		"created_at":     "2024-01-02T03:04:05Z",
		"updated_at":     "2024-01-02T03:04:05Z",
		"pushed_at":      "2024-01-02T03:04:05Z",
	}
}

// pushRepoJSON is the repository of a push payload, which differs from the rest: the owner
// also has "name" and "email", the timestamps are Unix seconds, and master_branch is set.
func pushRepoJSON(r Repo) map[string]any {
	m := RepoJSON(r)
	owner := m["owner"].(map[string]any)
	owner["name"] = owner["login"]
	owner["email"] = nil
	m["created_at"] = 1704164645
	m["pushed_at"] = 1704164645
	m["master_branch"] = m["default_branch"]
	m["stargazers"] = 0
	return m
}

// PullRequestJSON is a pull request as GET /repos/{o}/{r}/pulls/{n} and pull_request payloads
// show it; base is the repository it belongs to.
func PullRequestJSON(base Repo, pr PR) map[string]any {
	headRepo := any(RepoJSON(base))
	headOwner, _, _ := strings.Cut(base.FullName, "/")
	if pr.HeadRepo != "" {
		headRepo = RepoJSON(Repo{FullName: pr.HeadRepo})
		headOwner, _, _ = strings.Cut(pr.HeadRepo, "/")
	}
	if pr.HeadRepoDeleted {
		headRepo = nil
	}
	baseOwner, _, _ := strings.Cut(base.FullName, "/")
	baseRef := cmpOr(pr.BaseRef, cmpOr(base.DefaultBranch, "main"))
	api := "https://api.github.com/repos/" + base.FullName
	n := strconv.Itoa(pr.Number)
	return map[string]any{
		"url":        api + "/pulls/" + n,
		"id":         numericID(base.FullName + "#" + n),
		"html_url":   "https://github.com/" + base.FullName + "/pull/" + n,
		"diff_url":   "https://github.com/" + base.FullName + "/pull/" + n + ".diff",
		"number":     pr.Number,
		"state":      cmpOr(pr.State, "open"),
		"locked":     false,
		"title":      cmpOr(pr.Title, "Pull request #"+n),
		"user":       userJSON(pr.User),
		"body":       nil,
		"draft":      false,
		"created_at": "2024-01-02T03:04:05Z",
		"updated_at": "2024-01-02T03:04:05Z",
		"merged_at":  nil,
		"head": map[string]any{
			"label": headOwner + ":" + pr.HeadRef,
			"ref":   pr.HeadRef,
			"sha":   pr.HeadSHA,
			"user":  userJSON(headOwner),
			"repo":  headRepo,
		},
		"base": map[string]any{
			"label": baseOwner + ":" + baseRef,
			"ref":   baseRef,
			"sha":   strings.Repeat("0", 39) + "1",
			"user":  userJSON(baseOwner),
			"repo":  RepoJSON(base),
		},
		"author_association": "CONTRIBUTOR",
		"merged":             false,
		"mergeable":          nil,
		"commits":            max(len(pr.Commits), 1),
	}
}

func installationRef(id int64) map[string]any {
	return map[string]any{"id": id, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9u" + strconv.FormatInt(id, 10)}
}

// Push describes a push event.
type Push struct {
	Repo         Repo
	Ref          string // "refs/heads/main", "refs/tags/v1"
	Before       string // 40 zeros if empty (a new branch)
	After        string // 40 zeros for a deletion
	Deleted      bool
	Sender       string
	Installation int64
}

// PushPayload is the body of a push delivery.
func PushPayload(p Push) map[string]any {
	zero := strings.Repeat("0", 40)
	before := cmpOr(p.Before, zero)
	var head any
	var commits []any
	if !p.Deleted && p.After != zero {
		head = map[string]any{
			"id":        p.After,
			"tree_id":   strings.Repeat("a", 40),
			"distinct":  true,
			"message":   "a commit",
			"timestamp": "2024-01-02T03:04:05+01:00",
			"url":       "https://github.com/" + p.Repo.FullName + "/commit/" + p.After,
			"author":    map[string]any{"name": p.Sender, "email": p.Sender + "@example.com", "username": p.Sender},
			"committer": map[string]any{"name": p.Sender, "email": p.Sender + "@example.com", "username": p.Sender},
			"added":     []string{}, "removed": []string{}, "modified": []string{"flake.nix"},
		}
		commits = append(commits, head)
	}
	m := map[string]any{
		"ref":         p.Ref,
		"before":      before,
		"after":       p.After,
		"repository":  pushRepoJSON(p.Repo),
		"pusher":      map[string]any{"name": p.Sender, "email": p.Sender + "@example.com"},
		"sender":      userJSON(p.Sender),
		"created":     before == zero,
		"deleted":     p.Deleted,
		"forced":      false,
		"base_ref":    nil,
		"compare":     "https://github.com/" + p.Repo.FullName + "/compare/" + before[:12] + "..." + p.After[:min(12, len(p.After))],
		"commits":     commits,
		"head_commit": head,
	}
	if p.Installation != 0 {
		m["installation"] = installationRef(p.Installation)
	}
	return m
}

// PullRequestEvent describes a pull_request event.
type PullRequestEvent struct {
	Action       string // "opened", "synchronize", "closed", ...
	Repo         Repo   // the base repository
	PR           PR
	Sender       string // the PR's user if empty
	Installation int64
}

// PullRequestPayload is the body of a pull_request delivery.
func PullRequestPayload(e PullRequestEvent) map[string]any {
	m := map[string]any{
		"action":       e.Action,
		"number":       e.PR.Number,
		"pull_request": PullRequestJSON(e.Repo, e.PR),
		"repository":   RepoJSON(e.Repo),
		"sender":       userJSON(cmpOr(e.Sender, e.PR.User)),
	}
	if e.Action == "synchronize" {
		m["before"] = strings.Repeat("1", 40)
		m["after"] = e.PR.HeadSHA
	}
	if e.Installation != 0 {
		m["installation"] = installationRef(e.Installation)
	}
	return m
}

// Comment describes an issue_comment event.
type Comment struct {
	Action        string // "created", "edited", "deleted"
	Repo          Repo
	Number        int  // the issue's or pull request's number
	OnPullRequest bool // false: a comment on a plain issue
	Commenter     string
	Body          string
	Installation  int64
	// CreatedAt is when the comment was written (comment.created_at); PRCreatedAt if zero.
	CreatedAt time.Time
}

// CommentPayload is the body of an issue_comment delivery.
func CommentPayload(c Comment) map[string]any {
	n := strconv.Itoa(c.Number)
	created := PRCreatedAt.Format(time.RFC3339)
	if !c.CreatedAt.IsZero() {
		created = c.CreatedAt.UTC().Format(time.RFC3339)
	}
	issue := map[string]any{
		"url":                "https://api.github.com/repos/" + c.Repo.FullName + "/issues/" + n,
		"html_url":           "https://github.com/" + c.Repo.FullName + "/issues/" + n,
		"id":                 numericID(c.Repo.FullName + "!" + n),
		"number":             c.Number,
		"title":              "Issue #" + n,
		"user":               userJSON("octocat"),
		"state":              "open",
		"comments":           1,
		"author_association": "NONE",
		"body":               nil,
	}
	if c.OnPullRequest {
		issue["html_url"] = "https://github.com/" + c.Repo.FullName + "/pull/" + n
		issue["pull_request"] = map[string]any{
			"url":       "https://api.github.com/repos/" + c.Repo.FullName + "/pulls/" + n,
			"html_url":  "https://github.com/" + c.Repo.FullName + "/pull/" + n,
			"diff_url":  "https://github.com/" + c.Repo.FullName + "/pull/" + n + ".diff",
			"patch_url": "https://github.com/" + c.Repo.FullName + "/pull/" + n + ".patch",
			"merged_at": nil,
		}
	}
	m := map[string]any{
		"action": c.Action,
		"issue":  issue,
		"comment": map[string]any{
			"id":                 numericID(c.Repo.FullName + "!" + n + c.Body),
			"html_url":           issue["html_url"].(string) + "#issuecomment-1",
			"user":               userJSON(c.Commenter),
			"body":               c.Body,
			"created_at":         created,
			"updated_at":         created,
			"author_association": "CONTRIBUTOR",
		},
		"repository": RepoJSON(c.Repo),
		"sender":     userJSON(c.Commenter),
	}
	if c.Installation != 0 {
		m["installation"] = installationRef(c.Installation)
	}
	return m
}

// InstallationPayload is the body of an installation delivery (action "created", "deleted",
// "suspend", ...) for installation id with access to repos.
func InstallationPayload(action string, id int64, sender string, repos ...Repo) map[string]any {
	list := []map[string]any{}
	for _, r := range repos {
		_, name, _ := strings.Cut(r.FullName, "/")
		list = append(list, map[string]any{"id": numericID(r.FullName), "node_id": "R_" + strconv.FormatInt(numericID(r.FullName), 36),
			"name": name, "full_name": r.FullName, "private": r.Private})
	}
	return map[string]any{
		"action": action,
		"installation": map[string]any{
			"id":                   id,
			"account":              userJSON(sender),
			"repository_selection": "selected",
			"target_type":          "User",
			"app_slug":             "harmonia-ci-test",
		},
		"repositories": list,
		"sender":       userJSON(sender),
	}
}
