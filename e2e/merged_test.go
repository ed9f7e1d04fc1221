package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// waitEvalStatus waits until sha's newest nix-eval status has state and returns it.
func (c *forgeCluster) waitEvalStatus(sha, state string, timeout time.Duration) giteatest.Status {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.checkRunning()
		ss := c.statuses(sha)
		if s := latest(ss, ctxEval); s.State == state {
			return s
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("statuses of %s after %s: want nix-eval %q; have:\n%s\nfront-1:\n%s",
				sha[:12], timeout, state, formatStatuses(ss), lastLines(c.procs["front-1"].Logs(), 40))
		}
		time.Sleep(100 * time.Millisecond) // polling Gitea's API, not synchronisation
	}
}

// A pull request is evaluated merged into its base, with the statuses on its head: a head that
// is green alone but breaks an attribute once merged (the base changed a file the attribute
// reads) is red; a conflicting one gets an error status and no evaluation; a base whose
// .harmonia-ci.toml says pull-requests = "head" has the next event evaluate the head alone.
func TestGiteaPullRequestEvaluatedMerged(t *testing.T) {
	c := newForgeCluster(t, forgeOptions{})
	ctx := context.Background()
	salt := uniqueSalt(t)
	lib := shLib(salt)
	c.push(c.owner, c.repo, "main", map[string]string{
		"ci.nix":    lib + ` { ok = sh "ok" [] "echo ok"; }`,
		"value.nix": "1\n",
	}, false)
	c.enable(nil)

	// A collaborator's fork, with two branches from main: one adds an attribute that needs
	// value.nix to be 1, the other changes value.nix.
	carol, err := c.gitea.CreateUser(ctx, giteatest.UniqueName("carol"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.gitea.AddCollaborator(ctx, c.repo, carol.Login, "write"); err != nil {
		t.Fatal(err)
	}
	fork, err := c.gitea.Fork(ctx, c.repo, carol)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"feature", "conflicting"} {
		if err := c.gitea.CreateBranch(ctx, fork, carol, b, "main"); err != nil {
			t.Fatal(err)
		}
	}
	head := c.push(carol, fork, "feature", map[string]string{
		"ci.nix": lib + ` { ok = sh "ok" [] "echo ok"; feature = assert import ./value.nix == 1; sh "feature" [] "echo feature"; }`,
	}, false)
	conflicting := c.push(carol, fork, "conflicting", map[string]string{"value.nix": "3\n"}, false)
	// The base moves on: the feature's attribute no longer holds once merged.
	base := c.push(c.owner, c.repo, "main", map[string]string{"value.nix": "2\n"}, false)

	pr, err := c.gitea.CreatePullRequest(ctx, carol, c.repo, "main", fork, "feature", "a feature")
	if err != nil {
		t.Fatal(err)
	}
	prConflict, err := c.gitea.CreatePullRequest(ctx, carol, c.repo, "main", fork, "conflicting", "another value")
	if err != nil {
		t.Fatal(err)
	}

	// Merged: red, on the head.
	red := c.waitEvalStatus(head, "failure", 3*time.Minute)
	if red.Description != "1 of 2 attributes failed to evaluate" {
		t.Errorf("merged pull request's nix-eval: %+v", red)
	}
	id, _ := c.evalOf(head, fmt.Sprintf("pull/%d", pr))
	var prBase, baseCommit, mergeCommit, attrErr string
	if err := c.pool.QueryRow(ctx, `SELECT pr_base, base_commit, merge_commit FROM evaluations WHERE id = $1`, id).
		Scan(&prBase, &baseCommit, &mergeCommit); err != nil {
		t.Fatal(err)
	}
	if prBase != "main" || baseCommit != base || len(mergeCommit) != 40 || mergeCommit == head {
		t.Errorf("merged evaluation records base %q at %s, merge %q; want main at %s and a merge", prBase, baseCommit, mergeCommit, base)
	}
	if err := c.pool.QueryRow(ctx, `SELECT COALESCE(error, '') FROM eval_attrs WHERE eval_id = $1 AND attr = 'feature'`, id).Scan(&attrErr); err != nil || !strings.Contains(attrErr, "assert") {
		t.Errorf("the feature attribute's error: %q (%v), want a failed assertion", attrErr, err)
	}

	// Conflicting: an error status saying so, and nothing evaluated.
	ss := c.waitStatuses(conflicting, "error", "", 3*time.Minute)
	if e := latest(ss, ctxEval); e.Description != "merge conflict: main and the pull request conflict in value.nix" {
		t.Errorf("conflicting pull request's nix-eval: %+v", e)
	}
	cid, st := c.evalOf(conflicting, fmt.Sprintf("pull/%d", prConflict))
	var attrs int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM eval_attrs WHERE eval_id = $1`, cid).Scan(&attrs); err != nil || st != status.EvalCancelled || attrs != 0 {
		t.Errorf("conflicting pull request's evaluation: %s with %d attributes (%v), want cancelled with none", st, attrs, err)
	}

	// The base chooses the head: the next event of the pull request (a "/ci run") evaluates its
	// head alone, green, in the same evaluation.
	c.push(c.owner, c.repo, "main", map[string]string{".harmonia-ci.toml": "pull-requests = \"head\"\n"}, false)
	if err := c.gitea.Comment(ctx, c.repo, c.owner, pr, "/ci run"); err != nil {
		t.Fatal(err)
	}
	c.waitStatuses(head, "success", "success", 3*time.Minute)
	if err := c.pool.QueryRow(ctx, `SELECT base_commit, merge_commit FROM evaluations WHERE id = $1`, id).
		Scan(&baseCommit, &mergeCommit); err != nil || baseCommit != "" || mergeCommit != "" {
		t.Errorf("head evaluation records base %q, merge %q (%v); want neither", baseCommit, mergeCommit, err)
	}
	if n := c.evaluations(head); n != 1 {
		t.Errorf("%d evaluations of the head, want its one evaluated again", n)
	}
}
