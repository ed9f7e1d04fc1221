package gitrepo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Snapshot commits what is on disk in workTree (its .gitignore files apply), plus the extra files
// (path → content, added or replacing), to branch of the repository at gitDir, created on first
// use. It returns the branch's commit: a new one when the tree changed, else the previous one, so
// the same files twice are the same commit. This is how `harmonia-ci run` evaluates a working
// directory, committed or not.
func Snapshot(ctx context.Context, gitDir, workTree, branch string, extra map[string][]byte) (string, error) {
	if err := ValidateBranch(branch); err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	if fi, err := os.Stat(workTree); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("snapshot: %s is not a directory", workTree)
	}
	if err := os.MkdirAll(filepath.Dir(gitDir), 0o755); err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	unlock, err := lock(ctx, gitDir+".lock")
	if err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(gitDir, "HEAD")); errors.Is(err, os.ErrNotExist) {
		if _, err := run(ctx, nil, "", "init", "--quiet", "--bare", gitDir); err != nil {
			return "", fmt.Errorf("snapshot: %w", err)
		}
	}
	git := func(stdin []byte, sub string, args ...string) (string, error) {
		var in io.Reader
		if stdin != nil {
			in = bytes.NewReader(stdin)
		}
		out, err := runIn(ctx, in, gitDir, workTree, sub, args...)
		return strings.TrimSpace(string(out)), err
	}
	if _, err := git(nil, "add", "--all"); err != nil {
		return "", fmt.Errorf("snapshot %s: %w", workTree, err)
	}
	for path, data := range extra {
		sha, err := git(data, "hash-object", "-w", "--stdin")
		if err != nil {
			return "", fmt.Errorf("snapshot: %w", err)
		}
		if _, err := git(nil, "update-index", "--add", "--cacheinfo", "100644,"+sha+","+path); err != nil {
			return "", fmt.Errorf("snapshot: %w", err)
		}
	}
	tree, err := git(nil, "write-tree")
	if err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	ref := "refs/heads/" + branch
	parent, _ := git(nil, "rev-parse", "--verify", "--quiet", ref)
	args := []string{tree, "-m", "harmonia-ci run snapshot of " + workTree}
	if parent != "" {
		if parentTree, err := git(nil, "rev-parse", parent+"^{tree}"); err == nil && parentTree == tree {
			return parent, nil
		}
		args = append(args, "-p", parent)
	}
	commit, err := git(nil, "commit-tree", args...)
	if err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	if _, err := git(nil, "update-ref", ref, commit); err != nil {
		return "", fmt.Errorf("snapshot: %w", err)
	}
	return commit, nil
}

// ShallowClone clones the tip of branch ("" for the remote's HEAD) of url into dir, for a
// one-off build of a repository.
func ShallowClone(ctx context.Context, url, branch, dir string) error {
	if err := ValidateURL(url); err != nil {
		return err
	}
	args := []string{"--quiet", "--depth", "1", "--no-tags"}
	if branch != "" {
		if err := ValidateBranch(branch); err != nil {
			return err
		}
		args = append(args, "--branch", branch)
	}
	if _, err := run(ctx, nil, "", "clone", append(args, "--", url, dir)...); err != nil {
		return fmt.Errorf("clone %s: %w", redact(url), err)
	}
	return nil
}
