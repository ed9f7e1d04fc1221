package gitrepo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// LocalRefPrefix is the namespace of the refs harmonia-ci makes in a mirror. Fetch neither
// takes refs there from upstream (a forge's user cannot plant one) nor prunes them.
const LocalRefPrefix = "refs/harmonia-ci/"

// mergeRefPrefix keeps the merges MergeInto makes reachable, for fetchers that take a ref.
const mergeRefPrefix = LocalRefPrefix + "merge/"

// ErrConflict is matched by the error of a merge that does not apply cleanly.
var ErrConflict = errors.New("merge conflict")

// ConflictError is a merge of head into base that does not apply cleanly.
type ConflictError struct {
	Branch string // the base branch
	Base   string // its tip
	Head   string
	Paths  []string // the conflicting paths, as git lists them
	// Unrelated is true when head and base share no history (Gitea opens such pull requests).
	Unrelated bool
}

func (e *ConflictError) Error() string {
	if e.Unrelated {
		return fmt.Sprintf("%s and %s share no history", e.Head, e.Branch)
	}
	if len(e.Paths) == 0 {
		return fmt.Sprintf("merging %s into %s conflicts", e.Head, e.Branch)
	}
	return fmt.Sprintf("merging %s into %s conflicts in %s", e.Head, e.Branch, strings.Join(e.Paths, ", "))
}

// Is makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Merge is a pull request's head merged into its base.
type Merge struct {
	Commit string // the merge commit, full sha
	Base   string // the base's tip it merges into
	Head   string
	// Forge is true when Commit is the forge's own merge (GitHub's refs/pull/N/merge).
	Forge bool
}

// MergeInto returns the commit that merges head, a full commit id, into the tip of branch
// base. The forge's merge ref forgeRef (GitHub's refs/pull/N/merge; "" for none) is taken when
// its parents are exactly that tip and head: the forge computes it asynchronously and leaves it
// stale or absent while it works, or after a conflict. Otherwise the merge is made here, with a
// fixed identity, message and date (the later of the parents' commit dates, which flakes read
// as lastModified), so the same base and head always give the same commit. A merge that does not
// apply cleanly is a *ConflictError.
func (m *Mirror) MergeInto(ctx context.Context, base, head, forgeRef string) (Merge, error) {
	tip, err := m.ResolveBranch(ctx, base)
	if err != nil {
		return Merge{}, err
	}
	if err := validateRev(head); err != nil {
		return Merge{}, err
	}
	head, err = m.ResolveCommit(ctx, head)
	if err != nil {
		return Merge{}, err
	}
	mg := Merge{Base: tip, Head: head}
	if forgeRef != "" {
		if !strings.HasPrefix(forgeRef, "refs/") || ValidateBranch(strings.TrimPrefix(forgeRef, "refs/")) != nil {
			return Merge{}, fmt.Errorf("merge ref %q: not a ref name", forgeRef)
		}
		if c, ok, err := m.revParse(ctx, forgeRef+"^{commit}"); err != nil {
			return Merge{}, fmt.Errorf("merge ref %s: %w", forgeRef, err)
		} else if ok {
			parents, err := m.parents(ctx, c)
			if err != nil {
				return Merge{}, err
			}
			if len(parents) == 2 && parents[0] == tip && parents[1] == head {
				mg.Commit, mg.Forge = c, true
				return mg, nil
			}
		}
	}
	// Without a common ancestor there is nothing to merge (merge-tree would refuse it too).
	_, err = run(ctx, nil, m.Dir, "merge-base", tip, head)
	var gerr *gitError
	if errors.As(err, &gerr) && gerr.code == 1 && gerr.stderr == "" {
		return Merge{}, &ConflictError{Branch: base, Base: tip, Head: head, Unrelated: true}
	}
	if err != nil {
		return Merge{}, fmt.Errorf("merge %s into %s: %w", head, base, err)
	}
	// --write-tree makes the merge without a work tree or index; exit status 1 is a conflict.
	out, err := runEnv(ctx, m.Dir, nil, "merge-tree", "--write-tree", "--name-only", "--no-messages", tip, head)
	if errors.As(err, &gerr) && gerr.code == 1 {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return Merge{}, &ConflictError{Branch: base, Base: tip, Head: head, Paths: lines[1:]}
	}
	if err != nil {
		return Merge{}, fmt.Errorf("merge %s into %s: %w", head, base, err)
	}
	tree, _, _ := strings.Cut(string(out), "\n")
	var date int64
	for _, c := range []string{tip, head} {
		d, err := run(ctx, nil, m.Dir, "show", "-s", "--format=%ct", c)
		if err != nil {
			return Merge{}, fmt.Errorf("merge %s into %s: %w", head, base, err)
		}
		t, err := strconv.ParseInt(strings.TrimSpace(string(d)), 10, 64)
		if err != nil {
			return Merge{}, fmt.Errorf("merge %s into %s: commit date of %s: %w", head, base, c, err)
		}
		date = max(date, t)
	}
	stamp := "@" + strconv.FormatInt(date, 10) + " +0000"
	c, err := runEnv(ctx, m.Dir, []string{
		"GIT_AUTHOR_NAME=harmonia-ci", "GIT_AUTHOR_EMAIL=harmonia-ci@localhost", "GIT_AUTHOR_DATE=" + stamp,
		"GIT_COMMITTER_NAME=harmonia-ci", "GIT_COMMITTER_EMAIL=harmonia-ci@localhost", "GIT_COMMITTER_DATE=" + stamp,
	}, "commit-tree", strings.TrimSpace(tree), "-p", tip, "-p", head, "-m", "Merge "+head+" into "+tip)
	if err != nil {
		return Merge{}, fmt.Errorf("merge %s into %s: %w", head, base, err)
	}
	mg.Commit = strings.TrimSpace(string(c))
	if _, err := run(ctx, nil, m.Dir, "update-ref", mergeRefPrefix+mg.Commit, mg.Commit); err != nil {
		return Merge{}, fmt.Errorf("merge %s into %s: %w", head, base, err)
	}
	return mg, nil
}

// parents returns the parents of commit c, in order.
func (m *Mirror) parents(ctx context.Context, c string) ([]string, error) {
	out, err := run(ctx, nil, m.Dir, "rev-list", "--parents", "-n", "1", c)
	if err != nil {
		return nil, fmt.Errorf("parents of %s: %w", c, err)
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return nil, fmt.Errorf("parents of %s: no output", c)
	}
	return f[1:], nil
}

// runEnv is run with extra environment variables; it returns stdout even when git fails.
func runEnv(ctx context.Context, gitDir string, env []string, sub string, args ...string) ([]byte, error) {
	cmd, stderr := command(ctx, nil, gitDir, "", sub, args...)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.Output()
	if err != nil {
		return out, commandError(ctx, sub, stderr, err)
	}
	return out, nil
}
