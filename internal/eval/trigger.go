package eval

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
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
// evaluation (see evaluation.Request).
func Trigger(ctx context.Context, pool *pgxpool.Pool, p TriggerParams) (evaluation.Evaluation, bool, error) {
	pr, err := project.Get(ctx, pool, p.Project)
	if err != nil {
		return evaluation.Evaluation{}, false, err
	}
	branch := p.Branch
	if branch == "" {
		branch = pr.Branch
	}
	if err := gitrepo.ValidateBranch(branch); err != nil {
		return evaluation.Evaluation{}, false, fmt.Errorf("branch: %w", err)
	}
	m, err := gitrepo.New(MirrorDir(p.StateDir, pr.ID), pr.RepoURL)
	if err != nil {
		return evaluation.Evaluation{}, false, err
	}
	if err := m.Fetch(ctx); err != nil {
		return evaluation.Evaluation{}, false, err
	}
	commit := p.Commit
	if commit == "" {
		commit, err = m.ResolveBranch(ctx, branch)
	} else {
		commit, err = m.ResolveCommit(ctx, commit)
	}
	if err != nil {
		return evaluation.Evaluation{}, false, err
	}
	tree, err := m.Tree(ctx, commit)
	if err != nil {
		tree = "" // no dedup, as the design says
	}
	return evaluation.Request(ctx, pool, evaluation.RequestParams{ProjectID: pr.ID, FlakeURL: pr.RepoURL, Commit: commit, Branch: branch, TreeHash: tree})
}
