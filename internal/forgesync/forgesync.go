// Package forgesync is the maintenance leader's forge work: it lists the forges' repositories
// at start and periodically (recording them, so an admin can enable their projects), and polls
// the default branch of projects that ask for it, handing a new head to the webhook path.
package forgesync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
)

// Defaults of Config's intervals.
const (
	DefaultSyncInterval = 15 * time.Minute
	DefaultPollCheck    = time.Minute
	callTimeout         = 30 * time.Second
)

// Config configures the tasks.
type Config struct {
	Forges       forge.Set
	SyncInterval time.Duration // default DefaultSyncInterval
	PollCheck    time.Duration // default DefaultPollCheck
	// Push hands a polled head to the webhook path.
	Push func(ctx context.Context, f forge.Forge, ev forge.Event) error
	// Reregister, if set, registers again the hooks of enabled projects registered for
	// another URL or before hooks had a secret each (project.Enabler.Reregister).
	Reregister func(ctx context.Context) (int, error)
	Logger     *slog.Logger
}

// Tasks returns the leader-only forge tasks: repository discovery and polling.
func Tasks(cfg Config, pool *pgxpool.Pool) []cluster.Task {
	if len(cfg.Forges) == 0 {
		return nil
	}
	log := cfg.Logger.With("service", "forge-sync")
	return []cluster.Task{
		{Name: "forge-repositories", Interval: cmp.Or(cfg.SyncInterval, DefaultSyncInterval),
			Prepare: func(ctx context.Context) (func(context.Context, pgx.Tx) (int64, error), error) {
				listed := map[string][]forge.Repository{}
				var errs []error
				for _, name := range cfg.Forges.Names() {
					repos, err := list(ctx, cfg.Forges[name])
					if err != nil {
						errs = append(errs, err) // the other forges are still recorded
						continue
					}
					listed[name] = repos
				}
				if len(errs) > 0 {
					log.Warn("repository discovery failed", "error", errors.Join(errs...))
				}
				if cfg.Reregister != nil {
					n, err := cfg.Reregister(ctx)
					if err != nil {
						log.Warn("registering webhooks again failed", "error", err)
					}
					if n > 0 {
						log.Info("webhooks registered again", "count", n)
					}
				}
				return func(ctx context.Context, tx pgx.Tx) (int64, error) {
					var n int64
					for name, repos := range listed {
						k, err := project.SyncRepositories(ctx, tx, name, repos)
						if err != nil {
							return n, err
						}
						n += k
					}
					return n, nil
				}, nil
			}},
		{Name: "forge-poll", Interval: cmp.Or(cfg.PollCheck, DefaultPollCheck),
			Prepare: func(ctx context.Context) (func(context.Context, pgx.Tx) (int64, error), error) {
				due, err := project.DuePolls(ctx, pool)
				if err != nil || len(due) == 0 {
					return nil, err
				}
				var polled []int64
				for _, p := range due {
					if err := poll(ctx, cfg, p); err != nil {
						log.Warn("poll failed", "project", p.Name, "error", err)
						continue // due again at the next check
					}
					polled = append(polled, p.ID)
				}
				return func(ctx context.Context, tx pgx.Tx) (int64, error) {
					return project.MarkPolled(ctx, tx, polled)
				}, nil
			}},
	}
}

func list(ctx context.Context, f forge.Forge) ([]forge.Repository, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*callTimeout)
	defer cancel()
	repos, err := f.ListRepositories(ctx)
	if err != nil {
		return nil, fmt.Errorf("forge %s: %w", f.Name(), err)
	}
	return repos, nil
}

// poll reads the head of p's default branch and hands it to the webhook path as a push. Its
// delivery id names the project and commit, so an unchanged head is a replay: a no-op.
func poll(ctx context.Context, cfg Config, p project.Project) error {
	f, ok := cfg.Forges[p.Forge]
	if !ok {
		return fmt.Errorf("forge %q is not configured", p.Forge)
	}
	owner, name, _ := strings.Cut(p.FullName, "/")
	repo := forge.Repository{Repo: forge.Repo{Owner: owner, Name: name}, CloneURL: p.RepoURL, DefaultBranch: p.Branch}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	head, err := f.BranchHead(cctx, repo.Repo, p.Branch)
	if err != nil {
		return err
	}
	return cfg.Push(ctx, f, forge.Event{
		Kind: forge.EventPush, Type: "poll", DeliveryID: fmt.Sprintf("poll:%d:%s", p.ID, head),
		Repository: repo, Branch: p.Branch, After: head,
	})
}

// Discover lists one forge's repositories now and records them (on an installation webhook).
func Discover(ctx context.Context, pool *pgxpool.Pool, f forge.Forge) (int64, error) {
	repos, err := list(ctx, f)
	if err != nil {
		return 0, err
	}
	return project.SyncRepositories(ctx, pool, f.Name(), repos)
}
