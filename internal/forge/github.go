package forge

import (
	"context"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
)

// GitHub's public API and web addresses; GitHub Enterprise Server has both on its own host,
// the API under /api/v3.
const (
	GitHubAPIURL = "https://api.github.com"
	GitHubWebURL = "https://github.com"
)

// githubAPIVersion is the REST API version every request asks for.
const githubAPIVersion = "2022-11-28"

// githubMaxDescription is how many characters of a status description GitHub accepts.
const githubMaxDescription = 140

// Page guards: the most pages one listing reads. GitHub keeps at most 1000 statuses per commit
// and context (10 pages of 100).
const (
	githubMaxPages       = 1000
	githubMaxStatusPages = 50
)

// GitHubConfig configures a GitHub App forge.
type GitHubConfig struct {
	Name string // the [[forges]] name
	// APIURL is the REST API; default GitHubAPIURL. GitHub Enterprise Server:
	// https://host/api/v3.
	APIURL string
	// WebURL is where commits are shown; default GitHubWebURL for the default API, else APIURL
	// without /api/v3.
	WebURL        string
	AppID         int64
	PrivateKey    []byte // the App's private key, PEM (PKCS#1 as GitHub issues it, or PKCS#8)
	WebhookSecret []byte
	HTTPClient    *http.Client // nil: a default one with a 30 s timeout
}

// GitHub is a GitHub App: it acts on the repositories of every installation of the App, and
// receives all their events at the App's one webhook URL.
type GitHub struct {
	name   string
	web    string
	api    *api // no authentication: appAPI and installationAPI copy it and add their own
	appID  int64
	key    *rsa.PrivateKey
	secret []byte

	mu       sync.Mutex
	tokens   map[int64]*installationToken
	installs map[string]int64 // lower-case full name → installation, learnt on the way
}

// NewGitHub checks cfg and returns the forge.
func NewGitHub(cfg GitHubConfig) (*GitHub, error) {
	if cfg.AppID <= 0 {
		return nil, fmt.Errorf("github forge %s: app_id %d: want the App's positive id", cfg.Name, cfg.AppID)
	}
	key, err := parseRSAKey(cfg.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("github forge %s: private key: %w", cfg.Name, err)
	}
	if len(cfg.WebhookSecret) == 0 {
		return nil, fmt.Errorf("github forge %s: no webhook secret", cfg.Name)
	}
	apiURL := strings.TrimRight(cmpOr(cfg.APIURL, GitHubAPIURL), "/")
	a, err := newAPI(apiURL, cfg.HTTPClient)
	if err != nil {
		return nil, fmt.Errorf("github forge %s: %w", cfg.Name, err)
	}
	a.header.Set("Accept", "application/vnd.github+json")
	a.header.Set("X-GitHub-Api-Version", githubAPIVersion)
	a.header.Set("User-Agent", "harmonia-ci")
	web := strings.TrimRight(cfg.WebURL, "/")
	if web == "" {
		web = githubWebURL(a.base)
	}
	return &GitHub{name: cfg.Name, web: web, api: a, appID: cfg.AppID, key: key, secret: cfg.WebhookSecret,
		tokens: map[int64]*installationToken{}, installs: map[string]int64{}}, nil
}

// githubWebURL derives the web address from the API's: github.com for api.github.com, the
// same host without /api/v3 for Enterprise, the API's origin otherwise.
func githubWebURL(api *url.URL) string {
	if api.Host == "api.github.com" {
		return GitHubWebURL
	}
	return api.Scheme + "://" + api.Host + strings.TrimSuffix(strings.TrimSuffix(api.Path, "/"), "/api/v3")
}

// Name implements Forge.
func (g *GitHub) Name() string { return g.name }

// Type implements Forge.
func (g *GitHub) Type() string { return TypeGitHub }

// WebhookVerifier implements Forge: X-Hub-Signature-256, "sha256=" and the hex HMAC-SHA256 of
// the body (the older SHA-1 X-Hub-Signature is not accepted on its own). A GitHub App has one webhook secret, set in the App's
// settings and visible only to the App's owner, for the deliveries of every installation: it
// is checked at the forge-wide URL only.
func (g *GitHub) WebhookVerifier(h http.Header, repoID int64) (*Verifier, error) {
	const header = "X-Hub-Signature-256"
	if repoID != 0 {
		return nil, fmt.Errorf("%w: a GitHub App delivers to /webhook/{forge}", ErrSignature)
	}
	sig := h.Get(header)
	if sig == "" {
		return nil, fmt.Errorf("%w: no %s header", ErrSignature, header)
	}
	hexSig, ok := strings.CutPrefix(sig, "sha256=")
	if !ok {
		return nil, fmt.Errorf("%w: %s does not start with sha256=", ErrSignature, header)
	}
	return newVerifier(g.secret, hexSig, header)
}

// githubUser is a user (or organisation) as GitHub's JSON shows it; push payloads name the
// repository owner with "name" as well.
type githubUser struct {
	ID    int64  `json:"id"`
	Login string `json:"login"`
	Name  string `json:"name"`
}

type githubRepo struct {
	ID            int64      `json:"id"`
	Name          string     `json:"name"`
	FullName      string     `json:"full_name"`
	Owner         githubUser `json:"owner"`
	CloneURL      string     `json:"clone_url"`
	DefaultBranch string     `json:"default_branch"`
	Private       bool       `json:"private"`
}

func (r githubRepo) repository(installation int64) (Repository, error) {
	owner, name, ok := strings.Cut(r.FullName, "/")
	if !ok {
		owner, name = cmpOr(r.Owner.Login, r.Owner.Name), r.Name
	}
	repo := Repository{Repo: Repo{Owner: owner, Name: name, InstallationID: installation, ForgeID: r.ID},
		CloneURL: r.CloneURL, DefaultBranch: r.DefaultBranch, Private: r.Private}
	return repo, repo.validate()
}

type githubPR struct {
	Number int        `json:"number"`
	State  string     `json:"state"`
	User   githubUser `json:"user"`
	Head   struct {
		SHA  string      `json:"sha"`
		Ref  string      `json:"ref"`
		Repo *githubRepo `json:"repo"` // null when the fork is deleted
	} `json:"head"`
	Base struct {
		Ref  string      `json:"ref"`
		Repo *githubRepo `json:"repo"`
	} `json:"base"`
}

func (p githubPR) pullRequest() (PullRequest, error) {
	pr := PullRequest{Number: p.Number, HeadSHA: p.Head.SHA, HeadBranch: p.Head.Ref,
		BaseBranch: p.Base.Ref, Author: p.User.Login, AuthorID: max(p.User.ID, 0), State: p.State}
	pr.Fork = p.Head.Repo == nil || p.Base.Repo == nil ||
		!strings.EqualFold(p.Head.Repo.FullName, p.Base.Repo.FullName)
	return pr, pr.validate()
}

// ParseWebhook decodes push, pull_request, issue_comment, installation and
// installation_repositories deliveries; other events are EventIgnored.
func (g *GitHub) ParseWebhook(h http.Header, body []byte) (Event, error) {
	ev := Event{Kind: EventIgnored, DeliveryID: h.Get("X-GitHub-Delivery"), Type: h.Get("X-GitHub-Event")}
	var p struct {
		Action     string `json:"action"`
		Ref        string `json:"ref"`
		After      string `json:"after"`
		HeadCommit *struct {
			TreeID string `json:"tree_id"`
		} `json:"head_commit"`
		Deleted      bool        `json:"deleted"`
		Number       int         `json:"number"`
		Repository   *githubRepo `json:"repository"`
		Sender       githubUser  `json:"sender"`
		Installation *struct {
			ID int64 `json:"id"`
		} `json:"installation"`
		PullRequest *githubPR `json:"pull_request"`
		Issue       *struct {
			Number      int             `json:"number"`
			PullRequest json.RawMessage `json:"pull_request"`
		} `json:"issue"`
		Comment *struct {
			Body      string     `json:"body"`
			User      githubUser `json:"user"`
			CreatedAt time.Time  `json:"created_at"`
		} `json:"comment"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return ev, fmt.Errorf("github %s delivery: %w", ev.Type, err)
	}
	ev.Action, ev.Sender, ev.SenderID = p.Action, p.Sender.Login, max(p.Sender.ID, 0)
	var installation int64
	if p.Installation != nil {
		installation = p.Installation.ID
	}
	switch ev.Type {
	case "installation", "installation_repositories":
		ev.Kind = EventInstallation
		return ev, nil
	case "push", "pull_request", "issue_comment":
	default:
		return ev, nil // ping, check_suite, ...: nothing to do
	}
	if p.Repository == nil {
		return ev, fmt.Errorf("github %s delivery: no repository", ev.Type)
	}
	repo, err := p.Repository.repository(installation)
	if err != nil {
		return ev, fmt.Errorf("github %s delivery: %w", ev.Type, err)
	}
	ev.Repository = repo
	g.cacheInstallation(repo.Repo)
	if ev.Sender != "" && validGitHubLogin(ev.Sender) != nil {
		return ev, fmt.Errorf("github %s delivery: sender %q", ev.Type, ev.Sender)
	}
	switch ev.Type {
	case "push":
		branch, ok := strings.CutPrefix(p.Ref, "refs/heads/")
		if !ok || p.Deleted || isZeroSHA(p.After) {
			return ev, nil // a tag, or a deleted branch
		}
		if !isSHA(p.After) {
			return ev, fmt.Errorf("github push delivery: after %q is not a commit id", p.After)
		}
		if err := gitrepo.ValidateBranch(branch); err != nil {
			return ev, fmt.Errorf("github push delivery: %w", err)
		}
		ev.Kind, ev.Branch, ev.After = EventPush, branch, p.After
		if p.HeadCommit != nil && isSHA(p.HeadCommit.TreeID) {
			ev.Tree = p.HeadCommit.TreeID // tree-hash dedup without a forge call
		}
	case "pull_request":
		if p.Action != "opened" && p.Action != "reopened" && p.Action != "synchronize" {
			return ev, nil
		}
		if p.PullRequest == nil {
			return ev, errors.New("github pull_request delivery: no pull_request")
		}
		if p.PullRequest.Number == 0 {
			p.PullRequest.Number = p.Number
		}
		pr, err := p.PullRequest.pullRequest()
		if err != nil {
			return ev, fmt.Errorf("github pull_request delivery: %w", err)
		}
		ev.Kind, ev.PullRequest = EventPullRequest, pr
	case "issue_comment":
		// GitHub files pull request conversation comments as issue comments; the issue then
		// has a pull_request object.
		if p.Action != "created" || p.Issue == nil || len(p.Issue.PullRequest) == 0 || string(p.Issue.PullRequest) == "null" {
			return ev, nil
		}
		if p.Comment == nil {
			return ev, errors.New("github issue_comment delivery: no comment")
		}
		if p.Issue.Number <= 0 {
			return ev, fmt.Errorf("github issue_comment delivery: pull request number %d", p.Issue.Number)
		}
		if err := validGitHubLogin(p.Comment.User.Login); err != nil {
			return ev, fmt.Errorf("github issue_comment delivery: commenter: %w", err)
		}
		ev.Kind = EventComment
		ev.PullRequest = PullRequest{Number: p.Issue.Number}
		ev.Commenter, ev.Body, ev.CommentedAt = p.Comment.User.Login, p.Comment.Body, p.Comment.CreatedAt
	}
	return ev, nil
}

// cacheInstallation remembers which installation a delivery's repository belongs to, for calls
// whose Repo comes without one.
func (g *GitHub) cacheInstallation(r Repo) {
	if r.InstallationID <= 0 {
		return
	}
	g.mu.Lock()
	g.installs[strings.ToLower(r.FullName())] = r.InstallationID
	g.mu.Unlock()
}

// validGitHubLogin checks a login before it goes into a URL: letters, digits and single
// hyphens, not starting with one, at most 39 characters; "[bot]" for Apps; an "_shortcode"
// suffix for Enterprise managed users.
func validGitHubLogin(login string) error {
	base := strings.TrimSuffix(login, "[bot]")
	if user, short, ok := strings.Cut(base, "_"); ok && base == login {
		base = user
		if short == "" || !isAlnumHyphen(short) {
			return fmt.Errorf("login %q: not a GitHub login", login)
		}
	}
	if base == "" || len(base) > 39 || base[0] == '-' || strings.Contains(base, "--") || !isAlnumHyphen(base) {
		return fmt.Errorf("login %q: not a GitHub login", login)
	}
	return nil
}

func isAlnumHyphen(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// githubPages GETs rawURL and the pages its Link headers name, decoding each page into a new T
// and passing it to page, which returns false to stop early.
func githubPages[T any](ctx context.Context, g *GitHub, do func(ctx context.Context, method, rawURL string, body, out any) (http.Header, error),
	rawURL string, limit int, page func(T) bool) error {
	for i := 0; rawURL != ""; i++ {
		if i >= limit {
			return fmt.Errorf("GET %s: more than %d pages", rawURL, limit)
		}
		var p T
		h, err := do(ctx, http.MethodGet, rawURL, nil, &p)
		if err != nil {
			return err
		}
		if !page(p) {
			return nil
		}
		next := nextPage(h)
		if next != "" && !g.api.sameOrigin(next) {
			return fmt.Errorf("GET %s: next page %q is on another host", rawURL, next)
		}
		rawURL = next
	}
	return nil
}

type githubInstallation struct {
	ID          int64      `json:"id"`
	Account     githubUser `json:"account"`
	SuspendedAt *time.Time `json:"suspended_at"`
}

// ListRepositories returns the repositories of every installation of the App; those of
// suspended installations are left out (GitHub refuses their tokens).
func (g *GitHub) ListRepositories(ctx context.Context) ([]Repository, error) {
	per := url.Values{"per_page": {"100"}}
	insts, err := getAll[githubInstallation](ctx, g.appAPI(), g.endpoint(per, "app", "installations"), githubMaxPages)
	if err != nil {
		return nil, fmt.Errorf("list installations: %w", err)
	}
	seen := map[string]bool{}
	var out []Repository
	for _, inst := range insts {
		if inst.SuspendedAt != nil {
			continue
		}
		do := func(ctx context.Context, method, rawURL string, body, out any) (http.Header, error) {
			return g.installationDo(ctx, inst.ID, method, rawURL, body, out)
		}
		type page struct {
			TotalCount   int          `json:"total_count"`
			Repositories []githubRepo `json:"repositories"`
		}
		var raw []githubRepo
		err := githubPages(ctx, g, do, g.endpoint(per, "installation", "repositories"), githubMaxPages, func(p page) bool {
			raw = append(raw, p.Repositories...)
			return true
		})
		if errors.Is(err, ErrNotFound) {
			continue // uninstalled since it was listed
		}
		if err != nil {
			return nil, fmt.Errorf("list repositories of installation %d (%s): %w", inst.ID, inst.Account.Login, err)
		}
		for _, r := range raw {
			repo, err := r.repository(inst.ID)
			if err != nil || seen[strings.ToLower(repo.FullName())] {
				continue // a name we could not use anyway
			}
			seen[strings.ToLower(repo.FullName())] = true
			g.cacheInstallation(repo.Repo)
			out = append(out, repo)
		}
	}
	return out, nil
}

// Permission asks GET /repos/{o}/{r}/collaborators/{u}/permission as the installation; a user
// GitHub does not know (404) has none.
func (g *GitHub) Permission(ctx context.Context, repo Repo, login string) (Permission, error) {
	if err := ValidateRepo(repo); err != nil {
		return PermissionNone, err
	}
	if err := validGitHubLogin(login); err != nil {
		return PermissionNone, err
	}
	var perm struct {
		Permission string `json:"permission"`
		RoleName   string `json:"role_name"`
	}
	_, err := g.repoDo(ctx, repo, http.MethodGet, g.repoURL(repo, nil, "collaborators", login, "permission"), nil, &perm)
	if errors.Is(err, ErrNotFound) {
		return PermissionNone, nil
	}
	if err != nil {
		return PermissionNone, fmt.Errorf("permission of %s on %s: %w", login, repo.FullName(), err)
	}
	// role_name is the precise role; a custom role's name is none of GitHub's words, and then
	// the legacy permission (the role it is based on) decides.
	if p := parsePermission(perm.RoleName); p != PermissionNone {
		return p, nil
	}
	return parsePermission(perm.Permission), nil
}

// githubMaxPRCommitPages bounds the listing of a pull request's commits: GitHub lists at most
// 250 (3 pages of 100).
const githubMaxPRCommitPages = 3

// PullRequestCommits lists GET /repos/{o}/{r}/pulls/{n}/commits.
func (g *GitHub) PullRequestCommits(ctx context.Context, repo Repo, number int) ([]Commit, error) {
	if err := ValidateRepo(repo); err != nil {
		return nil, err
	}
	if number <= 0 {
		return nil, fmt.Errorf("commits of %s#%d: not a pull request number", repo.FullName(), number)
	}
	id, err := g.installationFor(ctx, repo)
	if err != nil {
		return nil, err
	}
	do := func(ctx context.Context, method, rawURL string, body, out any) (http.Header, error) {
		return g.installationDo(ctx, id, method, rawURL, body, out)
	}
	type githubCommit struct {
		SHA    string `json:"sha"`
		Commit struct {
			Committer struct {
				Date time.Time `json:"date"`
			} `json:"committer"`
		} `json:"commit"`
	}
	var out []Commit
	u := g.repoURL(repo, url.Values{"per_page": {"100"}}, "pulls", strconv.Itoa(number), "commits")
	err = githubPages(ctx, g, do, u, githubMaxPRCommitPages, func(page []githubCommit) bool {
		for _, c := range page {
			out = append(out, Commit{SHA: c.SHA, Time: c.Commit.Committer.Date})
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("commits of %s#%d: %w", repo.FullName(), number, err)
	}
	for _, c := range out {
		if !isSHA(c.SHA) {
			return nil, fmt.Errorf("commits of %s#%d: commit id %q", repo.FullName(), number, c.SHA)
		}
	}
	return out, nil
}

// PullRequest implements Forge.
func (g *GitHub) PullRequest(ctx context.Context, repo Repo, number int) (PullRequest, error) {
	if err := ValidateRepo(repo); err != nil {
		return PullRequest{}, err
	}
	if number <= 0 {
		return PullRequest{}, fmt.Errorf("pull request %s#%d: not a pull request number", repo.FullName(), number)
	}
	var p githubPR
	if _, err := g.repoDo(ctx, repo, http.MethodGet, g.repoURL(repo, nil, "pulls", strconv.Itoa(number)), nil, &p); err != nil {
		return PullRequest{}, fmt.Errorf("pull request %s#%d: %w", repo.FullName(), number, err)
	}
	pr, err := p.pullRequest()
	if err != nil {
		return PullRequest{}, fmt.Errorf("pull request %s#%d: %w", repo.FullName(), number, err)
	}
	return pr, nil
}

// BranchHead implements Forge.
func (g *GitHub) BranchHead(ctx context.Context, repo Repo, branch string) (string, error) {
	if err := ValidateRepo(repo); err != nil {
		return "", err
	}
	if err := gitrepo.ValidateBranch(branch); err != nil {
		return "", fmt.Errorf("branch of %s: %w", repo.FullName(), err)
	}
	var b struct {
		Commit struct {
			SHA string `json:"sha"`
		} `json:"commit"`
	}
	if _, err := g.repoDo(ctx, repo, http.MethodGet, g.repoURL(repo, nil, "branches", branch), nil, &b); err != nil {
		return "", fmt.Errorf("branch %s of %s: %w", branch, repo.FullName(), err)
	}
	if !isSHA(b.Commit.SHA) {
		return "", fmt.Errorf("branch %s of %s: commit id %q", branch, repo.FullName(), b.Commit.SHA)
	}
	return b.Commit.SHA, nil
}

type githubStatus struct {
	State       string `json:"state"`
	TargetURL   string `json:"target_url,omitempty"`
	Description string `json:"description,omitempty"`
	Context     string `json:"context"`
}

// ReportStatus implements Forge. The description is cut to GitHub's 140 characters, which
// would otherwise refuse the status.
func (g *GitHub) ReportStatus(ctx context.Context, repo Repo, sha string, s Status) error {
	if err := ValidateRepo(repo); err != nil {
		return err
	}
	if !isSHA(sha) {
		return fmt.Errorf("status on %s: %q is not a commit id", repo.FullName(), sha)
	}
	switch s.State {
	case StatePending, StateSuccess, StateFailure, StateError:
	default:
		return fmt.Errorf("status %s on %s: state %q", s.Context, repo.FullName(), s.State)
	}
	body := githubStatus{State: string(s.State), TargetURL: s.TargetURL, Context: s.Context,
		Description: truncateRunes(s.Description, githubMaxDescription)}
	if _, err := g.repoDo(ctx, repo, http.MethodPost, g.repoURL(repo, nil, "statuses", sha), body, nil); err != nil {
		return fmt.Errorf("status %s on %s@%s: %w", s.Context, repo.FullName(), sha[:12], err)
	}
	return nil
}

// LatestStatus implements Forge. GitHub lists a commit's statuses newest first, so the first
// one with the context is the answer and later pages are read only until it shows up.
func (g *GitHub) LatestStatus(ctx context.Context, repo Repo, sha, statusContext string) (Status, bool, error) {
	if err := ValidateRepo(repo); err != nil {
		return Status{}, false, err
	}
	if !isSHA(sha) {
		return Status{}, false, fmt.Errorf("statuses of %s: %q is not a commit id", repo.FullName(), sha)
	}
	id, err := g.installationFor(ctx, repo)
	if err != nil {
		return Status{}, false, err
	}
	do := func(ctx context.Context, method, rawURL string, body, out any) (http.Header, error) {
		return g.installationDo(ctx, id, method, rawURL, body, out)
	}
	var found *githubStatus
	u := g.repoURL(repo, url.Values{"per_page": {"100"}}, "commits", sha, "statuses")
	err = githubPages(ctx, g, do, u, githubMaxStatusPages, func(page []githubStatus) bool {
		for i := range page {
			if page[i].Context == statusContext {
				found = &page[i]
				return false
			}
		}
		return true
	})
	if err != nil {
		return Status{}, false, fmt.Errorf("statuses of %s@%s: %w", repo.FullName(), sha[:12], err)
	}
	if found == nil {
		return Status{}, false, nil
	}
	return Status{Context: found.Context, State: State(found.State), Description: found.Description, TargetURL: found.TargetURL}, true, nil
}

// RegisterWebhook does nothing: a GitHub App gets every installation's events at its own
// webhook URL, set in the App's settings.
func (g *GitHub) RegisterWebhook(context.Context, Repo, string) (string, error) { return "", nil }

// DeleteWebhook does nothing, as RegisterWebhook.
func (g *GitHub) DeleteWebhook(context.Context, Repo, string) error { return nil }

// CommitURL implements Forge.
func (g *GitHub) CommitURL(repo Repo, sha string) string {
	return g.web + "/" + url.PathEscape(repo.Owner) + "/" + url.PathEscape(repo.Name) + "/commit/" + url.PathEscape(sha)
}

// truncateRunes cuts s to at most n characters, ending in "…" when it cut.
func truncateRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
