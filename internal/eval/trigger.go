package eval

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
)

// TriggerParams name what to evaluate the way a user or a push does.
type TriggerParams struct {
	Project  string
	Commit   string // full or abbreviated sha; "" means the head of Branch
	Branch   string // "" means the project's default branch
	StateDir string // the repository mirror lives in STATE_DIR/git
}

// MirrorDir is where a project's repository mirror lives.
func MirrorDir(stateDir string, projectID int64) string {
	return filepath.Join(stateDir, "git", strconv.FormatInt(projectID, 10)+".git")
}

// Trigger resolves the commit and its tree in the project's repository and requests its
// evaluation (see Request).
func Trigger(ctx context.Context, pool *pgxpool.Pool, p TriggerParams) (Evaluation, bool, error) {
	pr, err := project.Get(ctx, pool, p.Project)
	if err != nil {
		return Evaluation{}, false, err
	}
	branch := p.Branch
	if branch == "" {
		branch = pr.Branch
	}
	if err := gitrepo.ValidateBranch(branch); err != nil {
		return Evaluation{}, false, fmt.Errorf("branch: %w", err)
	}
	m, err := gitrepo.New(MirrorDir(p.StateDir, pr.ID), pr.RepoURL)
	if err != nil {
		return Evaluation{}, false, err
	}
	if err := m.Fetch(ctx); err != nil {
		return Evaluation{}, false, err
	}
	commit := p.Commit
	if commit == "" {
		commit, err = m.ResolveBranch(ctx, branch)
	} else {
		commit, err = m.ResolveCommit(ctx, commit)
	}
	if err != nil {
		return Evaluation{}, false, err
	}
	tree, err := m.Tree(ctx, commit)
	if err != nil {
		tree = "" // no dedup, as the design says
	}
	return Request(ctx, pool, RequestParams{ProjectID: pr.ID, FlakeURL: pr.RepoURL, Commit: commit, Branch: branch, TreeHash: tree})
}
