package project

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
)

// ErrNoRepository is returned for a repository id that does not exist.
var ErrNoRepository = errors.New("no such repository")

// ErrForgeNotConfigured is returned when acting on a repository of a forge this node has no
// [[forges]] entry for.
var ErrForgeNotConfigured = errors.New("forge not configured on this node")

// Repository is a repository row: one a forge listed, or one added by URL, with its project
// if it has one.
type Repository struct {
	ID             int64     `json:"id"`
	Forge          string    `json:"forge"`
	FullName       string    `json:"full_name"`
	CloneURL       string    `json:"clone_url"`
	DefaultBranch  string    `json:"default_branch"`
	Private        bool      `json:"private"`
	InstallationID int64     `json:"installation_id,omitempty"`
	HookID         string    `json:"hook_id,omitempty"`
	LastSynced     time.Time `json:"last_synced"`
	Project        string    `json:"project,omitempty"` // "" if none
	Enabled        bool      `json:"enabled"`           // the project is enabled
	// ForgeID is the forge's id of the repository (0: not recorded yet).
	ForgeID int64 `json:"forge_id,omitempty"`
}

// Repo is the forge's name of the repository.
func (r Repository) Repo() forge.Repo {
	owner, name, _ := strings.Cut(r.FullName, "/")
	return forge.Repo{Owner: owner, Name: name, InstallationID: r.InstallationID, ForgeID: r.ForgeID}
}

// SyncRepositories records the repositories a forge listed: new ones are added, known ones
// updated (clone URL, default branch, visibility, installation). It returns how many rows
// changed.
func SyncRepositories(ctx context.Context, q db.DBTX, forgeName string, repos []forge.Repository) (int64, error) {
	var n int64
	for _, r := range repos {
		if err := forge.ValidateRepo(r.Repo); err != nil {
			continue // listed by the forge, but not a name we can use
		}
		tag, err := q.Exec(ctx, sqlUpsertRepository, forgeName, r.Owner, r.Name, r.FullName(), r.CloneURL,
			r.Private, r.DefaultBranch, r.InstallationID, r.ForgeID)
		if err != nil {
			return n, fmt.Errorf("record repository %s: %w", r.FullName(), err)
		}
		n += tag.RowsAffected()
	}
	return n, nil
}

// ListRepositories returns the repositories of forgeName ("" for every forge) whose name
// contains search ("" for all), by forge and name.
func ListRepositories(ctx context.Context, pool *pgxpool.Pool, forgeName, search string) ([]Repository, error) {
	rows, err := pool.Query(ctx, sqlListRepositories, forgeName, search)
	if err != nil {
		return nil, fmt.Errorf("list repositories: %w", err)
	}
	rs, err := pgx.CollectRows(rows, scanRepository)
	if err != nil {
		return nil, fmt.Errorf("list repositories: %w", err)
	}
	return rs, nil
}

// GetRepository returns repository id.
func GetRepository(ctx context.Context, q db.DBTX, id int64) (Repository, error) {
	rows, err := q.Query(ctx, sqlRepositoryByID, id)
	if err != nil {
		return Repository{}, fmt.Errorf("get repository %d: %w", id, err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, scanRepository)
	if errors.Is(err, pgx.ErrNoRows) {
		return Repository{}, fmt.Errorf("repository %d: %w", id, ErrNoRepository)
	}
	if err != nil {
		return Repository{}, fmt.Errorf("get repository %d: %w", id, err)
	}
	return r, nil
}

// ByRepository returns the project of a forge's repository; ErrNotFound if it has none.
func ByRepository(ctx context.Context, q db.DBTX, forgeName, fullName string) (Project, error) {
	rows, err := q.Query(ctx, sqlProjectByRepo, forgeName, fullName)
	if err != nil {
		return Project{}, fmt.Errorf("project of %s/%s: %w", forgeName, fullName, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanProject)
	if errors.Is(err, pgx.ErrNoRows) {
		return Project{}, fmt.Errorf("%s repository %s: %w", forgeName, fullName, ErrNotFound)
	}
	if err != nil {
		return Project{}, fmt.Errorf("project of %s/%s: %w", forgeName, fullName, err)
	}
	return p, nil
}

// Settings are a project's adjustable settings; nil fields are left alone.
type Settings struct {
	Shares       *int           `json:"shares,omitempty"`
	PREnabled    *bool          `json:"pr_enabled,omitempty"`
	PRTrust      *string        `json:"pr_trust,omitempty"`
	PollInterval *time.Duration `json:"-"`
	// PromotePROutputs: see Project.PromotePROutputs. An admin's setting, never the
	// repository's (a pull request could change that).
	PromotePROutputs *bool `json:"promote_pr_outputs,omitempty"`
}

// Validate checks the settings that are set.
func (s Settings) Validate() error {
	if s.Shares != nil && (*s.Shares < 1 || *s.Shares > 1_000_000) {
		return fmt.Errorf("shares must be between 1 and 1000000, got %d", *s.Shares)
	}
	if s.PRTrust != nil {
		switch *s.PRTrust {
		case PRTrustCollaborators, PRTrustAll, PRTrustNone:
		default:
			return fmt.Errorf("pr_trust %q: want collaborators, all or none", *s.PRTrust)
		}
	}
	if s.PollInterval != nil {
		d := *s.PollInterval
		if d < 0 || (d > 0 && d < time.Minute) || d > 7*24*time.Hour || d%time.Second != 0 {
			return fmt.Errorf("poll_interval %s: want 0 (webhooks only) or whole seconds from 1m to 7d", d)
		}
	}
	return nil
}

func (s Settings) pollSeconds() *int {
	if s.PollInterval == nil {
		return nil
	}
	n := int(*s.PollInterval / time.Second)
	return &n
}

// EnableParams enable a repository's project.
type EnableParams struct {
	// Name of a new project; default the repository's name, or owner-name when that is taken.
	Name string
	Settings
}

// Enabler enables and disables the projects of forge repositories, registering and removing
// their webhooks.
type Enabler struct {
	Pool   *pgxpool.Pool
	Forges forge.Set
	// PublicURL is where the forge delivers webhooks: PublicURL/webhook/{forge}/{forge id}
	// (a GitHub App: PublicURL/webhook/{forge}, set in the App's settings).
	PublicURL string
	// Configured says PublicURL is the cluster's configured one, not this node's endpoint:
	// Reregister moves hooks registered for another URL to it.
	Configured bool
}

// deployKeyRegistrar is a forge whose private repositories are read with a deploy key
// (forge.Gitea).
type deployKeyRegistrar interface {
	RegisterDeployKey(ctx context.Context, repo forge.Repo) error
}

// Enable creates or re-enables the project of repository repoID with p's settings, after
// registering the repository's webhook (a forge with per-installation webhooks has none).
func (en Enabler) Enable(ctx context.Context, repoID int64, p EnableParams) (Project, error) {
	if err := p.Settings.Validate(); err != nil {
		return Project{}, err
	}
	if p.Name != "" {
		if err := ValidateName(p.Name); err != nil {
			return Project{}, err
		}
	}
	repo, err := GetRepository(ctx, en.Pool, repoID)
	if err != nil {
		return Project{}, err
	}
	f, ok := en.Forges[repo.Forge]
	if !ok {
		return Project{}, fmt.Errorf("repository %d is on forge %q: %w", repoID, repo.Forge, ErrForgeNotConfigured)
	}
	// The network call comes first and outside any transaction; registering is idempotent,
	// so a failure below leaves a hook the next Enable finds again (and re-registers: a hook
	// of an earlier Enable gets this URL and the repository's own secret).
	base := en.hookBase(repo.Forge)
	hookID, err := f.RegisterWebhook(ctx, repo.Repo(), base)
	if err != nil {
		return Project{}, fmt.Errorf("enable %s: %w", repo.FullName, err)
	}
	// A private repository's evaluations fetch with a read-only deploy key where the forge has
	// them (Gitea): registered now, so a token that may not do it fails here rather than at the
	// first evaluation (which registers it too, should it be removed since).
	if dk, ok := f.(deployKeyRegistrar); ok && repo.Private {
		if err := dk.RegisterDeployKey(ctx, repo.Repo()); err != nil {
			return Project{}, fmt.Errorf("enable %s: %w", repo.FullName, err)
		}
	}
	var pr Project
	err = pgx.BeginFunc(ctx, en.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlSetHook, repoID, hookID, base); err != nil {
			return err
		}
		name := p.Name
		if repo.Project != "" {
			name = repo.Project
		} else if name == "" {
			name, err = freeName(ctx, tx, repo)
			if err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, sqlEnableProject, repoID, name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlProjectSettings, repoID, p.Shares, p.PREnabled, p.PRTrust, p.pollSeconds(), p.PromotePROutputs); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, sqlProjectByRepoID, repoID)
		if err != nil {
			return err
		}
		pr, err = pgx.CollectExactlyOneRow(rows, scanProject)
		return err
	})
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "23505" {
		return Project{}, fmt.Errorf("enable %s: %w (project name %q is taken; choose another)", repo.FullName, ErrExists, p.Name)
	}
	if err != nil {
		return Project{}, fmt.Errorf("enable %s: %w", repo.FullName, err)
	}
	return pr, nil
}

// hookBase is where forgeName's hooks deliver: PublicURL/webhook/{forge}.
func (en Enabler) hookBase(forgeName string) string {
	return strings.TrimRight(en.PublicURL, "/") + "/webhook/" + forgeName
}

// Reregister registers again the webhooks of enabled projects whose hook was registered
// before hooks had a secret each, or (when PublicURL is Configured) for another public URL,
// and returns how many it registered. A repository that fails is left for the next call.
func (en Enabler) Reregister(ctx context.Context) (int, error) {
	rows, err := en.Pool.Query(ctx, sqlStaleHooks, en.Forges.Names(), strings.TrimRight(en.PublicURL, "/"), en.Configured)
	if err != nil {
		return 0, fmt.Errorf("hooks to register again: %w", err)
	}
	stale, err := pgx.CollectRows(rows, scanRepository)
	if err != nil {
		return 0, fmt.Errorf("hooks to register again: %w", err)
	}
	var n int
	var errs []error
	for _, repo := range stale {
		base := en.hookBase(repo.Forge)
		hookID, err := en.Forges[repo.Forge].RegisterWebhook(ctx, repo.Repo(), base)
		if err == nil {
			_, err = en.Pool.Exec(ctx, sqlSetHook, repo.ID, hookID, base)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("register the webhook of %s again: %w", repo.FullName, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// Disable disables the project of repository repoID (its queued evaluations wait, webhooks
// are answered without action) and removes the repository's webhook.
func (en Enabler) Disable(ctx context.Context, repoID int64) (Project, error) {
	repo, err := GetRepository(ctx, en.Pool, repoID)
	if err != nil {
		return Project{}, err
	}
	if repo.Project == "" {
		return Project{}, fmt.Errorf("repository %d (%s) has no project: %w", repoID, repo.FullName, ErrNotFound)
	}
	if _, err := en.Pool.Exec(ctx, sqlDisableProject, repoID); err != nil {
		return Project{}, fmt.Errorf("disable %s: %w", repo.FullName, err)
	}
	if repo.HookID != "" {
		f, ok := en.Forges[repo.Forge]
		if !ok {
			return Project{}, fmt.Errorf("disabled %s, but its webhook stays: %w", repo.FullName, ErrForgeNotConfigured)
		}
		if err := f.DeleteWebhook(ctx, repo.Repo(), repo.HookID); err != nil {
			return Project{}, fmt.Errorf("disabled %s, but its webhook stays: %w", repo.FullName, err)
		}
		if _, err := en.Pool.Exec(ctx, sqlClearHook, repoID, repo.HookID); err != nil {
			return Project{}, fmt.Errorf("disable %s: %w", repo.FullName, err)
		}
	}
	return Get(ctx, en.Pool, repo.Project)
}

// Configure changes the settings of repository repoID's project.
func Configure(ctx context.Context, pool *pgxpool.Pool, repoID int64, s Settings) (Project, error) {
	if err := s.Validate(); err != nil {
		return Project{}, err
	}
	tag, err := pool.Exec(ctx, sqlProjectSettings, repoID, s.Shares, s.PREnabled, s.PRTrust, s.pollSeconds(), s.PromotePROutputs)
	if err != nil {
		return Project{}, fmt.Errorf("configure the project of repository %d: %w", repoID, err)
	}
	if tag.RowsAffected() == 0 {
		return Project{}, fmt.Errorf("repository %d has no project: %w", repoID, ErrNotFound)
	}
	rows, err := pool.Query(ctx, sqlProjectByRepoID, repoID)
	if err != nil {
		return Project{}, fmt.Errorf("configure the project of repository %d: %w", repoID, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanProject)
	if err != nil {
		return Project{}, fmt.Errorf("configure the project of repository %d: %w", repoID, err)
	}
	return p, nil
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// freeName picks a new project's name: the repository's name, else owner-name, else
// owner-name-ID.
func freeName(ctx context.Context, tx pgx.Tx, repo Repository) (string, error) {
	owner, name, _ := strings.Cut(repo.FullName, "/")
	clean := func(s string) string {
		s = strings.TrimLeft(unsafeName.ReplaceAllString(s, "-"), "._-")
		if len(s) > 50 {
			s = s[:50]
		}
		return s
	}
	for _, c := range []string{clean(name), clean(owner + "-" + name), fmt.Sprintf("%s-%d", clean(owner+"-"+name), repo.ID)} {
		if ValidateName(c) != nil {
			continue
		}
		var taken bool
		if err := tx.QueryRow(ctx, sqlNameTaken, c).Scan(&taken); err != nil {
			return "", err
		}
		if !taken {
			return c, nil
		}
	}
	return fmt.Sprintf("repo-%d", repo.ID), nil
}

// DuePolls returns the enabled forge projects with a poll_interval whose last poll is that
// long ago (or never happened).
func DuePolls(ctx context.Context, q db.DBTX) ([]Project, error) {
	rows, err := q.Query(ctx, sqlDuePolls)
	if err != nil {
		return nil, fmt.Errorf("projects due for polling: %w", err)
	}
	ps, err := pgx.CollectRows(rows, scanProject)
	if err != nil {
		return nil, fmt.Errorf("projects due for polling: %w", err)
	}
	return ps, nil
}

// MarkPolled records that project id's default branch was just polled.
func MarkPolled(ctx context.Context, q db.DBTX, ids []int64) (int64, error) {
	tag, err := q.Exec(ctx, sqlMarkPolled, ids)
	if err != nil {
		return 0, fmt.Errorf("record polls: %w", err)
	}
	return tag.RowsAffected(), nil
}
