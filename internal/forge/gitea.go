package forge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
)

// GiteaConfig configures a Gitea (or Forgejo) forge.
type GiteaConfig struct {
	Name          string
	URL           string // the instance, e.g. https://gitea.example.com
	Token         string // an access token of the CI's account (repository and user scopes)
	WebhookSecret []byte
	HTTPClient    *http.Client // nil: a default one with a 30 s timeout
}

// Gitea is a Gitea or Forgejo instance, reached with one account's token.
type Gitea struct {
	name   string
	web    string
	api    *api
	secret []byte
}

// giteaHookEvents are the events a registered hook delivers. Gitea files comments on pull
// requests under pull_request_comment, not issue_comment.
var giteaHookEvents = []string{"push", "pull_request", "issue_comment", "pull_request_comment"}

// NewGitea checks cfg and returns the forge.
func NewGitea(cfg GiteaConfig) (*Gitea, error) {
	if cfg.Token == "" {
		return nil, fmt.Errorf("gitea forge %s: no token", cfg.Name)
	}
	if len(cfg.WebhookSecret) == 0 {
		return nil, fmt.Errorf("gitea forge %s: no webhook secret", cfg.Name)
	}
	web := strings.TrimRight(cfg.URL, "/")
	a, err := newAPI(web+"/api/v1", cfg.HTTPClient)
	if err != nil {
		return nil, fmt.Errorf("gitea forge %s: %w", cfg.Name, err)
	}
	token := cfg.Token
	a.auth = func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "token "+token)
		return nil
	}
	a.header.Set("User-Agent", "harmonia-ci")
	return &Gitea{name: cfg.Name, web: web, api: a, secret: cfg.WebhookSecret}, nil
}

// Name implements Forge.
func (g *Gitea) Name() string { return g.name }

// Type implements Forge.
func (g *Gitea) Type() string { return TypeGitea }

// WebhookVerifier implements Forge: X-Gitea-Signature, the hex HMAC-SHA256 of the body under
// the repository's secret. Every repository's hook has its own secret, which its
// admins can read: the forge-wide URL, whose secret would be the configured one, accepts
// nothing.
func (g *Gitea) WebhookVerifier(h http.Header, repoID int64) (*Verifier, error) {
	if repoID <= 0 {
		return nil, fmt.Errorf("%w: gitea deliveries are signed per repository, at /webhook/{forge}/{repository id}", ErrSignature)
	}
	return newVerifier(RepositorySecret(g.secret, repoID), h.Get("X-Gitea-Signature"), "X-Gitea-Signature")
}

// giteaUser is a user as Gitea's JSON shows it.
type giteaUser struct {
	ID    int64  `json:"id"`
	Login string `json:"login"`
}

type giteaRepo struct {
	ID            int64     `json:"id"`
	Name          string    `json:"name"`
	FullName      string    `json:"full_name"`
	Owner         giteaUser `json:"owner"`
	CloneURL      string    `json:"clone_url"`
	DefaultBranch string    `json:"default_branch"`
	Private       bool      `json:"private"`
}

func (r giteaRepo) repository() (Repository, error) {
	owner, name, ok := strings.Cut(r.FullName, "/")
	if !ok {
		owner, name = r.Owner.Login, r.Name
	}
	repo := Repository{Repo: Repo{Owner: owner, Name: name, ForgeID: r.ID}, CloneURL: r.CloneURL,
		DefaultBranch: r.DefaultBranch, Private: r.Private}
	return repo, repo.validate()
}

type giteaPR struct {
	Number int       `json:"number"`
	State  string    `json:"state"`
	User   giteaUser `json:"user"`
	Head   struct {
		Sha  string     `json:"sha"`
		Ref  string     `json:"ref"`
		Repo *giteaRepo `json:"repo"`
	} `json:"head"`
	Base struct {
		Ref  string     `json:"ref"`
		Repo *giteaRepo `json:"repo"`
	} `json:"base"`
}

func (p giteaPR) pullRequest() (PullRequest, error) {
	pr := PullRequest{Number: p.Number, HeadSHA: p.Head.Sha, HeadBranch: p.Head.Ref,
		BaseBranch: p.Base.Ref, Author: p.User.Login, AuthorID: max(p.User.ID, 0), State: p.State}
	pr.Fork = p.Head.Repo == nil || p.Base.Repo == nil || p.Head.Repo.FullName != p.Base.Repo.FullName
	return pr, pr.validate()
}

// ParseWebhook decodes push, pull_request and (pull request) comment deliveries.
func (g *Gitea) ParseWebhook(h http.Header, body []byte) (Event, error) {
	ev := Event{Kind: EventIgnored, DeliveryID: h.Get("X-Gitea-Delivery"), Type: h.Get("X-Gitea-Event")}
	var p struct {
		Ref         string     `json:"ref"`
		After       string     `json:"after"`
		Action      string     `json:"action"`
		Number      int        `json:"number"`
		Repository  *giteaRepo `json:"repository"`
		Sender      giteaUser  `json:"sender"`
		PullRequest *giteaPR   `json:"pull_request"`
		IsPull      bool       `json:"is_pull"`
		Issue       *struct {
			Number      int             `json:"number"`
			PullRequest json.RawMessage `json:"pull_request"`
		} `json:"issue"`
		Comment *struct {
			Body      string    `json:"body"`
			User      giteaUser `json:"user"`
			CreatedAt time.Time `json:"created_at"`
		} `json:"comment"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return ev, fmt.Errorf("gitea %s delivery: %w", ev.Type, err)
	}
	ev.Action, ev.Sender, ev.SenderID = p.Action, p.Sender.Login, max(p.Sender.ID, 0)
	if p.Repository == nil {
		if ev.Type == "push" || ev.Type == "pull_request" || ev.Type == "issue_comment" {
			return ev, fmt.Errorf("gitea %s delivery: no repository", ev.Type)
		}
		return ev, nil
	}
	repo, err := p.Repository.repository()
	if err != nil {
		return ev, fmt.Errorf("gitea %s delivery: %w", ev.Type, err)
	}
	ev.Repository = repo
	switch ev.Type {
	case "push":
		branch, ok := strings.CutPrefix(p.Ref, "refs/heads/")
		if !ok || isZeroSHA(p.After) {
			return ev, nil // a tag, or a deleted branch
		}
		if !isSHA(p.After) {
			return ev, fmt.Errorf("gitea push delivery: after %q is not a commit id", p.After)
		}
		ev.Kind, ev.Branch, ev.After = EventPush, branch, p.After
	case "pull_request":
		if p.Action != "opened" && p.Action != "reopened" && p.Action != "synchronized" {
			return ev, nil
		}
		if p.PullRequest == nil {
			return ev, errors.New("gitea pull_request delivery: no pull_request")
		}
		pr, err := p.PullRequest.pullRequest()
		if err != nil {
			return ev, fmt.Errorf("gitea pull_request delivery: %w", err)
		}
		ev.Kind, ev.PullRequest = EventPullRequest, pr
	case "issue_comment":
		// Gitea sends pull request comments with X-Gitea-Event issue_comment and is_pull set.
		if p.Action != "created" || p.Issue == nil || p.Comment == nil ||
			(!p.IsPull && (len(p.Issue.PullRequest) == 0 || string(p.Issue.PullRequest) == "null")) {
			return ev, nil
		}
		if p.Issue.Number <= 0 {
			return ev, fmt.Errorf("gitea issue_comment delivery: pull request number %d", p.Issue.Number)
		}
		ev.Kind = EventComment
		ev.PullRequest = PullRequest{Number: p.Issue.Number}
		// Gitea sends the pull request as it was when the comment was made: its head then is
		// the one an approval approves, whatever was pushed since.
		if p.PullRequest != nil && p.PullRequest.Number == p.Issue.Number {
			if pr, err := p.PullRequest.pullRequest(); err == nil {
				ev.PullRequest = pr
			}
		}
		ev.Commenter, ev.Body, ev.CommentedAt = p.Comment.User.Login, p.Comment.Body, p.Comment.CreatedAt
	}
	return ev, nil
}

func (g *Gitea) repoPath(r Repo, rest ...string) string {
	parts := []string{"/repos", url.PathEscape(r.Owner), url.PathEscape(r.Name)}
	for _, s := range rest {
		parts = append(parts, url.PathEscape(s))
	}
	return strings.Join(parts, "/")
}

// ListRepositories returns the repositories of the token's user, its collaborations and
// its organisations.
func (g *Gitea) ListRepositories(ctx context.Context) ([]Repository, error) {
	page := url.Values{"limit": {"50"}}
	raw, err := getAll[giteaRepo](ctx, g.api, g.api.url("/user/repos", page), 1000)
	if err != nil {
		return nil, fmt.Errorf("list repositories: %w", err)
	}
	orgs, err := getAll[giteaUser](ctx, g.api, g.api.url("/user/orgs", page), 100)
	if err != nil {
		return nil, fmt.Errorf("list organisations: %w", err)
	}
	for _, o := range orgs {
		rs, err := getAll[giteaRepo](ctx, g.api, g.api.url("/orgs/"+url.PathEscape(o.Login)+"/repos", page), 1000)
		if err != nil {
			return nil, fmt.Errorf("list repositories of %s: %w", o.Login, err)
		}
		raw = append(raw, rs...)
	}
	seen := map[string]bool{}
	var out []Repository
	for _, r := range raw {
		repo, err := r.repository()
		if err != nil || seen[repo.FullName()] {
			continue // a name we could not use anyway
		}
		seen[repo.FullName()] = true
		out = append(out, repo)
	}
	return out, nil
}

// Permission asks GET /repos/{o}/{r}/collaborators/{u}/permission (the CI account must be an
// admin of the repository); a user Gitea does not know has none.
func (g *Gitea) Permission(ctx context.Context, repo Repo, login string) (Permission, error) {
	if err := ValidateLogin(login); err != nil {
		return PermissionNone, err
	}
	var perm struct {
		Permission string `json:"permission"`
	}
	_, err := g.api.do(ctx, http.MethodGet, g.api.url(g.repoPath(repo, "collaborators", login, "permission"), nil), nil, &perm)
	if errors.Is(err, ErrNotFound) {
		return PermissionNone, nil
	}
	if err != nil {
		return PermissionNone, fmt.Errorf("permission of %s on %s: %w", login, repo.FullName(), err)
	}
	return parsePermission(perm.Permission), nil
}

// PullRequest implements Forge.
func (g *Gitea) PullRequest(ctx context.Context, repo Repo, number int) (PullRequest, error) {
	var p giteaPR
	_, err := g.api.do(ctx, http.MethodGet, g.api.url(g.repoPath(repo, "pulls", strconv.Itoa(number)), nil), nil, &p)
	if err != nil {
		return PullRequest{}, fmt.Errorf("pull request %s#%d: %w", repo.FullName(), number, err)
	}
	pr, err := p.pullRequest()
	if err != nil {
		return PullRequest{}, fmt.Errorf("pull request %s#%d: %w", repo.FullName(), number, err)
	}
	return pr, nil
}

// giteaMaxPRCommitPages bounds the listing of a pull request's commits (50 a page).
const giteaMaxPRCommitPages = 20

// PullRequestCommits lists GET /repos/{o}/{r}/pulls/{n}/commits, without the files and
// signature checks Gitea would otherwise add to each. Gitea lists them as git log does,
// newest first; they are returned oldest first, as the interface says.
func (g *Gitea) PullRequestCommits(ctx context.Context, repo Repo, number int) ([]Commit, error) {
	if err := ValidateRepo(repo); err != nil {
		return nil, err
	}
	if number <= 0 {
		return nil, fmt.Errorf("commits of %s#%d: not a pull request number", repo.FullName(), number)
	}
	type giteaCommit struct {
		SHA    string `json:"sha"`
		Commit struct {
			Committer struct {
				Date time.Time `json:"date"`
			} `json:"committer"`
		} `json:"commit"`
	}
	q := url.Values{"limit": {"50"}, "files": {"false"}, "verification": {"false"}}
	raw, err := getAll[giteaCommit](ctx, g.api, g.api.url(g.repoPath(repo, "pulls", strconv.Itoa(number), "commits"), q), giteaMaxPRCommitPages)
	if err != nil {
		return nil, fmt.Errorf("commits of %s#%d: %w", repo.FullName(), number, err)
	}
	out := make([]Commit, 0, len(raw))
	for _, c := range raw {
		if !isSHA(c.SHA) {
			return nil, fmt.Errorf("commits of %s#%d: commit id %q", repo.FullName(), number, c.SHA)
		}
		out = append(out, Commit{SHA: c.SHA, Time: c.Commit.Committer.Date})
	}
	slices.Reverse(out)
	return out, nil
}

// BranchHead implements Forge.
func (g *Gitea) BranchHead(ctx context.Context, repo Repo, branch string) (string, error) {
	var b struct {
		Commit struct {
			ID string `json:"id"`
		} `json:"commit"`
	}
	if _, err := g.api.do(ctx, http.MethodGet, g.api.url(g.repoPath(repo, "branches", branch), nil), nil, &b); err != nil {
		return "", fmt.Errorf("branch %s of %s: %w", branch, repo.FullName(), err)
	}
	if !isSHA(b.Commit.ID) {
		return "", fmt.Errorf("branch %s of %s: commit id %q", branch, repo.FullName(), b.Commit.ID)
	}
	return b.Commit.ID, nil
}

type giteaStatus struct {
	ID          int64  `json:"id"`
	Context     string `json:"context"`
	State       string `json:"status"`
	Description string `json:"description"`
	TargetURL   string `json:"target_url"`
}

// ReportStatus implements Forge.
func (g *Gitea) ReportStatus(ctx context.Context, repo Repo, sha string, s Status) error {
	if !isSHA(sha) {
		return fmt.Errorf("status on %s: %q is not a commit id", repo.FullName(), sha)
	}
	body := map[string]string{"state": string(s.State), "context": s.Context,
		"description": truncate(s.Description, 255), "target_url": s.TargetURL}
	if _, err := g.api.do(ctx, http.MethodPost, g.api.url(g.repoPath(repo, "statuses", sha), nil), body, nil); err != nil {
		return fmt.Errorf("status %s on %s@%s: %w", s.Context, repo.FullName(), sha[:12], err)
	}
	return nil
}

// LatestStatus implements Forge.
func (g *Gitea) LatestStatus(ctx context.Context, repo Repo, sha, context string) (Status, bool, error) {
	if !isSHA(sha) {
		return Status{}, false, fmt.Errorf("statuses of %s: %q is not a commit id", repo.FullName(), sha)
	}
	all, err := getAll[giteaStatus](ctx, g.api, g.api.url(g.repoPath(repo, "statuses", sha), url.Values{"limit": {"50"}}), 100)
	if err != nil {
		return Status{}, false, fmt.Errorf("statuses of %s@%s: %w", repo.FullName(), sha[:12], err)
	}
	var best *giteaStatus
	for i := range all {
		if all[i].Context == context && (best == nil || all[i].ID > best.ID) {
			best = &all[i]
		}
	}
	if best == nil {
		return Status{}, false, nil
	}
	return Status{Context: best.Context, State: State(best.State), Description: best.Description, TargetURL: best.TargetURL}, true, nil
}

type giteaHook struct {
	ID     int64             `json:"id"`
	Config map[string]string `json:"config"`
	Events []string          `json:"events"`
	Active bool              `json:"active"`
}

// RegisterWebhook creates the repository's hook to base/{forge id} with the repository's
// secret, then removes the hooks of ours it replaces (at base, as before hooks had their own
// secret, or under it). Gitea shows no hook's secret and keeps it when a hook is edited, so a
// hook is always created anew; created first, no push falls between two hooks.
func (g *Gitea) RegisterWebhook(ctx context.Context, repo Repo, base string) (string, error) {
	if repo.ForgeID <= 0 {
		return "", fmt.Errorf("register webhook on %s: the repository's forge id is not known yet", repo.FullName())
	}
	base = strings.TrimRight(base, "/")
	hookURL := base + "/" + strconv.FormatInt(repo.ForgeID, 10)
	hooks, err := getAll[giteaHook](ctx, g.api, g.api.url(g.repoPath(repo, "hooks"), url.Values{"limit": {"50"}}), 100)
	if err != nil {
		return "", fmt.Errorf("hooks of %s: %w", repo.FullName(), err)
	}
	body := map[string]any{
		"type":   "gitea",
		"active": true,
		"events": giteaHookEvents,
		"config": map[string]string{"url": hookURL, "content_type": "json",
			"secret": string(RepositorySecret(g.secret, repo.ForgeID))},
	}
	var h giteaHook
	if _, err := g.api.do(ctx, http.MethodPost, g.api.url(g.repoPath(repo, "hooks"), nil), body, &h); err != nil {
		return "", fmt.Errorf("register webhook on %s: %w", repo.FullName(), err)
	}
	for _, old := range hooks {
		if u := old.Config["url"]; old.ID != h.ID && (u == base || strings.HasPrefix(u, base+"/")) {
			if err := g.DeleteWebhook(ctx, repo, strconv.FormatInt(old.ID, 10)); err != nil {
				return "", err
			}
		}
	}
	return strconv.FormatInt(h.ID, 10), nil
}

// DeleteWebhook implements Forge.
func (g *Gitea) DeleteWebhook(ctx context.Context, repo Repo, hookID string) error {
	if _, err := strconv.ParseInt(hookID, 10, 64); err != nil {
		return fmt.Errorf("delete webhook of %s: hook id %q", repo.FullName(), hookID)
	}
	_, err := g.api.do(ctx, http.MethodDelete, g.api.url(g.repoPath(repo, "hooks", hookID), nil), nil, nil)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("delete webhook %s of %s: %w", hookID, repo.FullName(), err)
	}
	return nil
}

// CommitURL implements Forge.
func (g *Gitea) CommitURL(repo Repo, sha string) string {
	return g.web + "/" + url.PathEscape(repo.Owner) + "/" + url.PathEscape(repo.Name) + "/commit/" + url.PathEscape(sha)
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// giteaKey is a deploy key as Gitea's JSON shows it.
type giteaKey struct {
	ID          int64  `json:"id"`
	Key         string `json:"key"`
	Fingerprint string `json:"fingerprint"`
	ReadOnly    bool   `json:"read_only"`
}

// RegisterDeployKey makes sure the repository has its read-only deploy key (derived from the
// forge's secret and the repository's forge id, see deployKey): it is added unless Gitea lists
// it already. A key of the same fingerprint that is not read-only is replaced.
func (g *Gitea) RegisterDeployKey(ctx context.Context, repo Repo) error {
	if repo.ForgeID <= 0 {
		return fmt.Errorf("deploy key of %s: the repository's forge id is not known yet", repo.FullName())
	}
	key := deployKey(g.secret, repo.ForgeID)
	fp, err := fingerprint(key)
	if err != nil {
		return err
	}
	pub, err := authorizedKey(key)
	if err != nil {
		return err
	}
	keys, err := getAll[giteaKey](ctx, g.api, g.api.url(g.repoPath(repo, "keys"), url.Values{"limit": {"50"}}), 20)
	if err != nil {
		return fmt.Errorf("deploy keys of %s: %w", repo.FullName(), err)
	}
	for _, k := range keys {
		if k.Fingerprint != fp && keyContent(k.Key) != pub {
			continue
		}
		if k.ReadOnly {
			return nil
		}
		// Someone made it writable: a key that can push is not what evaluations get.
		if _, err := g.api.do(ctx, http.MethodDelete, g.api.url(g.repoPath(repo, "keys", strconv.FormatInt(k.ID, 10)), nil), nil, nil); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("delete writable deploy key of %s: %w", repo.FullName(), err)
		}
	}
	body := map[string]any{"title": deployKeyTitle, "key": pub, "read_only": true}
	if _, err := g.api.do(ctx, http.MethodPost, g.api.url(g.repoPath(repo, "keys"), nil), body, nil); err != nil {
		return fmt.Errorf("register deploy key on %s: %w", repo.FullName(), err)
	}
	return nil
}

// keyContent is an authorized_keys line without its comment: type and key.
func keyContent(line string) string {
	f := strings.Fields(line)
	if len(f) < 2 {
		return line
	}
	return f[0] + " " + f[1]
}

// ReadCredential implements Forge: the repository's read-only deploy key (registered if it is
// missing) and its ssh URL. Gitea has no short-lived read-only token the CI's account could
// mint through the API (creating tokens takes the account's password), so the key is the
// credential; it opens this one repository, read-only, and is derived, never stored.
func (g *Gitea) ReadCredential(ctx context.Context, r Repository) (gitrepo.Credential, error) {
	repo := r.Repo
	if err := g.RegisterDeployKey(ctx, repo); err != nil {
		return gitrepo.Credential{}, err
	}
	var info struct {
		SSHURL string `json:"ssh_url"`
	}
	if _, err := g.api.do(ctx, http.MethodGet, g.api.url(g.repoPath(repo), nil), nil, &info); err != nil {
		return gitrepo.Credential{}, fmt.Errorf("repository %s: %w", repo.FullName(), err)
	}
	if info.SSHURL == "" {
		return gitrepo.Credential{}, fmt.Errorf("repository %s: gitea shows no ssh URL (is its SSH server off?)", repo.FullName())
	}
	priv, err := openSSHPrivateKey(deployKey(g.secret, repo.ForgeID))
	if err != nil {
		return gitrepo.Credential{}, err
	}
	return gitrepo.Credential{URL: info.SSHURL, SSHKey: priv}, nil
}
