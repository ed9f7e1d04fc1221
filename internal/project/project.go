// Package project manages projects and their repositories (the repositories and projects
// rows): what the CI evaluates, from where, and with which share of the builders.
package project

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
)

// ErrNotFound is returned for a project name that does not exist.
var ErrNotFound = errors.New("no such project")

// ErrExists is returned when adding a project whose name or repository is taken.
var ErrExists = errors.New("project already exists")

// Project is one project with its repository.
type Project struct {
	ID        int64     `json:"id"`
	Name      string    `json:"name"`
	RepoURL   string    `json:"repo_url"`
	Branch    string    `json:"branch"` // the repository's default branch
	Shares    int       `json:"shares"`
	Enabled   bool      `json:"enabled"`
	CreatedAt time.Time `json:"created_at"`
	// The repository: its row, and for a forge's repository the forge and owner/name ("git"
	// and the URL for one added by URL).
	RepoID   int64  `json:"repo_id"`
	Forge    string `json:"forge"`
	FullName string `json:"full_name"`
	// Pull requests: evaluated at all, and whose (see PRTrust*).
	PREnabled bool   `json:"pr_enabled"`
	PRTrust   string `json:"pr_trust"`
	// PollInterval > 0 checks the default branch's head this often (besides webhooks).
	PollInterval time.Duration `json:"poll_interval"`
	// Private: the project's data is shown only to those who may read the repository
	// (internal/access).
	Private bool `json:"private"`
	// PromotePROutputs: a trusted evaluation takes what only pull requests built (quarantined)
	// as built, making it everyone's; false rebuilds it first.
	PromotePROutputs bool `json:"promote_pr_outputs"`
}

// Who may have a pull request evaluated (projects.pr_trust).
const (
	// PRTrustCollaborators evaluates pull requests by users with write access; others wait
	// for a collaborator's "/ci run" comment.
	PRTrustCollaborators = "collaborators"
	// PRTrustAll evaluates every pull request.
	PRTrustAll = "all"
	// PRTrustNone evaluates no pull request, only branch pushes.
	PRTrustNone = "none"
)

// ForgeGit is the forge of repositories added by URL (harmonia-ci project add).
const ForgeGit = "git"

// AddParams describe a new project.
type AddParams struct {
	Name    string
	RepoURL string // a local path (absolute, or relative to the working directory), file://, git, ssh or http(s) URL
	Branch  string // default "main"
	Shares  int    // default 100
	// Private makes the project's data readable by admins only: a repository added by URL has
	// no forge to ask who may read it.
	Private bool
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidateName checks a project name: letters, digits, '.', '_' and '-', at most 63
// characters, starting with a letter or digit (it appears in URLs and file names).
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("project name %q: want letters, digits, '.', '_' or '-', at most 63, starting with a letter or digit", name)
	}
	return nil
}

// NormalizeURL makes a local path absolute and validates the result. A URL that carries a
// credential is refused (ErrCredentialsInURL), and the error does not repeat it.
func NormalizeURL(u string) (string, error) {
	if hasCredentials(u) {
		return "", fmt.Errorf("repository %s: %w", RedactURL(u), ErrCredentialsInURL)
	}
	if u != "" && !strings.Contains(u, "://") && !strings.HasPrefix(u, "-") && !looksSCP(u) {
		abs, err := filepath.Abs(u)
		if err != nil {
			return "", fmt.Errorf("repository %q: %w", u, err)
		}
		u = abs
	}
	if err := gitrepo.ValidateURL(u); err != nil {
		return "", fmt.Errorf("repository: %w", err)
	}
	return u, nil
}

// looksSCP reports whether git would take u for a remote rather than a local path: a colon
// before any slash, as in scp-like [user@]host:path or a remote helper's transport::address.
// ValidateURL then accepts or rejects it as such; it must not become a local path.
func looksSCP(u string) bool {
	colon := strings.Index(u, ":")
	return colon >= 0 && !strings.Contains(u[:colon], "/")
}

// Add creates a project and its repository row.
func Add(ctx context.Context, pool *pgxpool.Pool, p AddParams) (Project, error) {
	if err := ValidateName(p.Name); err != nil {
		return Project{}, err
	}
	url, err := NormalizeURL(p.RepoURL)
	if err != nil {
		return Project{}, err
	}
	if p.Branch == "" {
		p.Branch = "main"
	}
	if err := gitrepo.ValidateBranch(p.Branch); err != nil {
		return Project{}, fmt.Errorf("branch: %w", err)
	}
	if p.Shares == 0 {
		p.Shares = 100
	}
	if p.Shares < 1 {
		return Project{}, fmt.Errorf("shares must be at least 1, got %d", p.Shares)
	}
	var pr Project
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var repoID int64
		if err := tx.QueryRow(ctx, sqlInsertRepository, url, p.Name, p.Branch, p.Private).Scan(&repoID); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sqlInsertProject, repoID, p.Name, p.Shares)
		if err != nil {
			return err
		}
		pr, err = pgx.CollectExactlyOneRow(rows, scanProject)
		return err
	})
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "23505" {
		return Project{}, fmt.Errorf("add project %s: %w (the name or the repository %s is already used)", p.Name, ErrExists, RedactURL(url))
	}
	if err != nil {
		return Project{}, fmt.Errorf("add project %s: %w", p.Name, err)
	}
	return pr, nil
}

// List returns every project, by name.
func List(ctx context.Context, pool *pgxpool.Pool) ([]Project, error) {
	rows, err := pool.Query(ctx, sqlListProjects)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	ps, err := pgx.CollectRows(rows, scanProject)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	return ps, nil
}

// Get returns the project called name.
func Get(ctx context.Context, q db.DBTX, name string) (Project, error) {
	rows, err := q.Query(ctx, sqlProjectByName, name)
	if err != nil {
		return Project{}, fmt.Errorf("get project %s: %w", name, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanProject)
	if errors.Is(err, pgx.ErrNoRows) {
		return Project{}, fmt.Errorf("project %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Project{}, fmt.Errorf("get project %s: %w", name, err)
	}
	return p, nil
}

// SetParams change a project; nil fields are left alone.
type SetParams struct {
	Shares  *int
	Enabled *bool
	Branch  *string
	// Private marks a project added by URL private (its data the admins' alone) or public; a
	// forge's repository is private as its forge says (ErrPrivateFromForge).
	Private *bool
}

// SetPrivate marks repository repoID, added by URL, private or public (ErrPrivateFromForge for
// a forge's, or no such repository).
func SetPrivate(ctx context.Context, q db.DBTX, repoID int64, private bool) error {
	tag, err := q.Exec(ctx, sqlSetURLRepoPrivateByID, repoID, private)
	if err != nil {
		return fmt.Errorf("mark repository %d private: %w", repoID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("repository %d: %w", repoID, ErrPrivateFromForge)
	}
	return nil
}

// ErrPrivateFromForge is returned when setting whether a forge's repository is private.
var ErrPrivateFromForge = errors.New("a forge's repository is private or public as its forge says (discovery records it); only a project added by URL can be marked private")

// Set changes a project's settings.
func Set(ctx context.Context, pool *pgxpool.Pool, name string, s SetParams) (Project, error) {
	if s.Shares != nil && *s.Shares < 1 {
		return Project{}, fmt.Errorf("shares must be at least 1, got %d", *s.Shares)
	}
	if s.Branch != nil {
		if err := gitrepo.ValidateBranch(*s.Branch); err != nil {
			return Project{}, fmt.Errorf("branch: %w", err)
		}
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlUpdateProject, name, s.Shares, s.Enabled, s.Branch)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("project %q: %w", name, ErrNotFound)
		}
		if s.Private == nil {
			return nil
		}
		if tag, err = tx.Exec(ctx, sqlSetURLRepoPrivate, name, *s.Private); err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("project %s: %w", name, ErrPrivateFromForge)
		}
		return nil
	})
	if err != nil {
		return Project{}, fmt.Errorf("set project %s: %w", name, err)
	}
	return Get(ctx, pool, name)
}
