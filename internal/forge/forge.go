// Package forge talks to code forges (Gitea/Forgejo and GitHub): it verifies and parses their
// webhook deliveries and calls their REST APIs for repositories, collaborators, pull requests,
// webhooks and commit statuses. Each forge type is one file implementing Forge; the rest of
// harmonia-ci sees only this interface.
package forge

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
)

// Forge types, as [[forges]] type spells them.
const (
	TypeGitea  = "gitea"
	TypeGitHub = "github"
)

// ErrSignature means a webhook delivery's signature is missing or wrong: answer 401 and record
// nothing.
var ErrSignature = errors.New("webhook signature missing or invalid")

// ErrNotFound is a repository, pull request, branch or hook the forge does not know.
var ErrNotFound = errors.New("not found on the forge")

// Forge is one configured forge instance.
type Forge interface {
	// Name is the [[forges]] name: webhooks arrive at /webhook/{name} and repositories are
	// recorded with it.
	Name() string
	// Type is TypeGitea or TypeGitHub.
	Type() string

	// WebhookVerifier starts checking a delivery's signature before its body is read: the body
	// is written to the Verifier as it streams. repoID is the forge id of the repository the
	// delivery's URL names, 0 for the forge-wide URL. A forge whose hooks have a secret per
	// repository (Gitea) refuses repoID 0, one with a single secret by nature (a GitHub App)
	// refuses any other; both, and a missing signature header, are errors wrapping
	// ErrSignature.
	WebhookVerifier(h http.Header, repoID int64) (*Verifier, error)
	// ParseWebhook decodes a verified delivery. Events harmonia-ci does not act on come back
	// with Kind EventIgnored rather than as an error; malformed bodies are errors.
	ParseWebhook(h http.Header, body []byte) (Event, error)

	// ListRepositories returns every repository the forge credentials can see (all pages).
	ListRepositories(ctx context.Context) ([]Repository, error)
	// Permission is login's access to repo: PermissionNone, Read, Write or Admin (a user the
	// forge does not know has none). Whether a user is trusted is WriteAccess, built on it.
	Permission(ctx context.Context, repo Repo, login string) (Permission, error)
	// UserID is the forge's numeric id of the user who has login now; an error wrapping
	// ErrNotFound if nobody has it. Logins can be renamed and then taken by someone else:
	// compare users by this id, never by login.
	UserID(ctx context.Context, login string) (int64, error)
	// PullRequest returns a pull request as it is now (its current head).
	PullRequest(ctx context.Context, repo Repo, number int) (PullRequest, error)
	// PullRequestCommits lists a pull request's commits as the forge has them now, oldest
	// first (GitHub lists at most 250).
	PullRequestCommits(ctx context.Context, repo Repo, number int) ([]Commit, error)
	// BranchHead returns the commit a branch points at now.
	BranchHead(ctx context.Context, repo Repo, branch string) (string, error)
	// ReportStatus sets a commit status (one context) on sha.
	ReportStatus(ctx context.Context, repo Repo, sha string, s Status) error
	// LatestStatus returns the newest status of context on sha; ok is false if there is none.
	// A frontend recovering a delivery another one may have made checks it before resending.
	LatestStatus(ctx context.Context, repo Repo, sha, context string) (s Status, ok bool, err error)
	// RegisterWebhook makes the forge deliver push, pull_request and issue_comment events of
	// repo to base/{repo.ForgeID}, signed with RepositorySecret of the repository, and returns
	// the hook's id. A hook of the repository's at base or under it already is updated to that
	// URL and secret (so enabling again re-registers it). Forges whose hooks are per
	// installation (GitHub Apps) return "" and do nothing.
	RegisterWebhook(ctx context.Context, repo Repo, base string) (hookID string, err error)
	// DeleteWebhook removes a hook RegisterWebhook made; a hook already gone is not an error.
	DeleteWebhook(ctx context.Context, repo Repo, hookID string) error
	// ReadCredential mints a short-lived credential that can only read repo (its CloneURL as
	// discovered), for one evaluation's fetch: a GitHub installation token scoped to the one
	// repository with contents: read, a Gitea read-only deploy key. See gitrepo.Credential.
	ReadCredential(ctx context.Context, repo Repository) (gitrepo.Credential, error)
	// CommitURL is the web page of a commit, for links.
	CommitURL(repo Repo, sha string) string
}

// Repo names a repository on a forge.
type Repo struct {
	Owner string
	Name  string
	// InstallationID is the GitHub App installation that can act on the repository; 0 elsewhere.
	InstallationID int64
	// ForgeID is the forge's numeric id of the repository (0: unknown). Unlike the name it
	// survives renames; a repository's webhook secret is derived from it.
	ForgeID int64
}

// FullName is "owner/name".
func (r Repo) FullName() string { return r.Owner + "/" + r.Name }

// Repository is a repository as ListRepositories and webhooks describe it.
type Repository struct {
	Repo
	CloneURL      string // https clone URL
	DefaultBranch string
	Private       bool
}

// PullRequest is a pull request's state.
type PullRequest struct {
	Number     int
	HeadSHA    string
	HeadBranch string
	BaseBranch string
	Author     string // login
	// AuthorID is the author's numeric user id (the payload's user.id); 0 when the forge
	// did not say.
	AuthorID int64
	// Fork is true when the head lives in another repository.
	Fork  bool
	State string // "open", "closed"
}

// Commit is a commit of a pull request. Time is its committer date, which whoever made the
// commit chose: it orders a pull request's commits against a comment, nothing more.
type Commit struct {
	SHA  string
	Time time.Time
}

// User is a forge account: its numeric id, which never changes, and its login, which the user
// can rename (and someone else can then take).
type User struct {
	ID    int64
	Login string
}

// State is a commit status state, the same words on Gitea and GitHub.
type State string

// Commit status states.
const (
	StatePending State = "pending"
	StateSuccess State = "success"
	StateFailure State = "failure"
	StateError   State = "error"
)

// Status is one commit status.
type Status struct {
	Context     string // "harmonia-ci/nix-eval", "harmonia-ci/nix-build"
	State       State
	Description string
	TargetURL   string
}

// EventKind says what a webhook delivery asks for.
type EventKind string

// Event kinds.
const (
	// EventPush is a push to a branch (not a tag, not a deletion).
	EventPush EventKind = "push"
	// EventPullRequest is a pull request opened, reopened or pushed to.
	EventPullRequest EventKind = "pull_request"
	// EventComment is a new comment on a pull request.
	EventComment EventKind = "comment"
	// EventInstallation means the repositories the forge credentials see changed (GitHub App
	// installation events): discover them again.
	EventInstallation EventKind = "installation"
	// EventIgnored is anything else (pings, tag pushes, branch deletions, closed pull
	// requests, comments on issues, edited comments): answered 200, nothing done.
	EventIgnored EventKind = "ignored"
)

// Event is a parsed webhook delivery.
type Event struct {
	Kind EventKind
	// DeliveryID is the forge's id of this delivery (X-Gitea-Delivery, X-GitHub-Delivery).
	DeliveryID string
	// Type is the forge's event name, for logs ("push", "pull_request", ...).
	Type string
	// Action is the forge's action for pull_request and comment events ("opened", "created").
	Action string
	// Repository is the repository the event happened in (absent for installation events).
	Repository Repository
	// Sender is the login of who caused the event, SenderID its numeric user id (0 when the
	// forge did not say).
	Sender   string
	SenderID int64

	// Push: the branch (without refs/heads/) and the commit it now points at, and that
	// commit's tree if the forge says (GitHub's head_commit.tree_id; "" otherwise).
	Branch string
	After  string
	Tree   string

	// PullRequest (EventPullRequest; EventComment: Number, and the rest as of the comment if the
	// forge sends it, as Gitea does; GitHub does not).
	PullRequest PullRequest
	// Comment (EventComment): its author, body, and when the forge says it was written (zero
	// if the delivery does not say).
	Commenter   string
	Body        string
	CommentedAt time.Time

	// BodySHA256 is the SHA-256 of the verified delivery's body, set by the receiver (zero for
	// polls): a body seen before is a replay whatever its delivery id.
	BodySHA256 [sha256.Size]byte
}

// VerifyWebhook checks a whole delivery's signature with f's WebhookVerifier, in constant time:
// an error wrapping ErrSignature when it is missing or does not match.
func VerifyWebhook(f Forge, h http.Header, repoID int64, body []byte) error {
	v, err := f.WebhookVerifier(h, repoID)
	if err != nil {
		return err
	}
	v.Write(body)
	return v.Verify()
}
