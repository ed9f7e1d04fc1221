package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A stranger's approved pull request builds a new derivation: anonymous cache users get 404 for
// its output, though the project is public, while the pull request's own dependent job builds
// on it (the builder reads it with its node token). After the merge, the default branch's
// evaluation takes it as built and it is served to everyone (promotion on); with promotion off,
// the branch rebuilds it first (a new attempt of its job), then serves it.
func TestPullRequestOutputsQuarantined(t *testing.T) {
	c := newForgeCluster(t, forgeOptions{})
	ctx := context.Background()
	salt := uniqueSalt(t)
	lib := shLib(salt)
	// Each pull request adds a file of its own, which main's ci.nix takes in once it exists: the
	// second pull request, branched from the fork's stale main, does not conflict.
	c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": lib + ` { ok = sh "ok" [] "echo ok"; }
  // (if builtins.pathExists ./pr0.nix then import ./pr0.nix sh else { })
  // (if builtins.pathExists ./pr1.nix then import ./pr1.nix sh else { })`}, false)
	c.enable(nil)
	bob, err := c.gitea.CreateUser(ctx, giteatest.UniqueName("bob"))
	if err != nil {
		t.Fatal(err)
	}
	fork, err := c.gitea.Fork(ctx, c.repo, bob)
	if err != nil {
		t.Fatal(err)
	}
	cacheURL := c.endpoint("front-1")
	narinfo := func(out, token string) int {
		t.Helper()
		sp, err := nix.ParseStorePath(out)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest(http.MethodGet, cacheURL+"/"+sp.Hash+".narinfo", nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		code, _ := sendRequest(t, req)
		return code
	}
	outputOf := func(drv string) string {
		t.Helper()
		var out string
		if err := c.pool.QueryRow(ctx, `SELECT output_path FROM derivation_outputs WHERE drv_path = $1 AND output_name = 'out'`, drv).Scan(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	attrDrv := func(evalID int64, attr string) string {
		t.Helper()
		var drv string
		if err := c.pool.QueryRow(ctx, `SELECT drv_path FROM eval_attrs WHERE eval_id = $1 AND attr = $2`, evalID, attr).Scan(&drv); err != nil {
			t.Fatal(err)
		}
		return drv
	}

	for i, promote := range []bool{true, false} {
		if !promote {
			if code, out := c.admin("front-1", http.MethodPost, fmt.Sprintf("/api/projects/%d/settings", c.repoID),
				map[string]any{"promote_pr_outputs": false}); code != http.StatusOK || !strings.Contains(out, `"promote_pr_outputs": false`) {
				t.Fatalf("promotion off: %d %s", code, out)
			}
		}
		branch := fmt.Sprintf("feature-%d", i)
		newName, depName := fmt.Sprintf("new%d", i), fmt.Sprintf("dep%d", i)
		if err := c.gitea.CreateBranch(ctx, fork, bob, branch, "main"); err != nil {
			t.Fatal(err)
		}
		head := c.push(bob, fork, branch, map[string]string{fmt.Sprintf("pr%d.nix", i): fmt.Sprintf(
			`sh: let new = sh %q [] "echo %s"; in { %[1]s = new; %[3]s = sh %[3]q [ new ] "echo %[3]s"; }`,
			newName, newName, depName)}, false)
		pr, err := c.gitea.CreatePullRequest(ctx, bob, c.repo, "main", fork, branch, "a new derivation")
		if err != nil {
			t.Fatal(err)
		}
		c.waitLog("front-1", fmt.Sprintf("pull request #%d by %s waits for a collaborator", pr, bob.Login), 1)
		if err := c.gitea.Comment(ctx, c.repo, c.owner, pr, "/ci run"); err != nil {
			t.Fatal(err)
		}
		c.waitStatuses(head, "success", "success", 3*time.Minute)
		prEval, _ := c.evalOf(head, fmt.Sprintf("pull/%d", pr))
		newDrv, depDrv := attrDrv(prEval, newName), attrDrv(prEval, depName)
		newOut := outputOf(newDrv)
		// The pull request's dependent job built on the quarantined output: its builder
		// fetched it from the cache with its node token.
		if j := c.job(depDrv); j.Status != status.JobSucceeded {
			t.Fatalf("promote %v: the pull request's dependent: %v", promote, j)
		}
		if code := narinfo(newOut, ""); code != http.StatusNotFound {
			t.Errorf("promote %v: anonymous GET of the pull request's output narinfo: %d, want 404", promote, code)
		}
		if code := narinfo(newOut, adminToken); code != http.StatusOK {
			t.Errorf("promote %v: the admin token's GET of the pull request's output narinfo: %d, want 200", promote, code)
		}
		if out, err := c.substitute(c.pub, newOut); err == nil {
			t.Errorf("promote %v: an anonymous Nix substituted the pull request's output:\n%s", promote, out)
		}
		attempt := c.job(newDrv).Attempt

		// The owner merges: main's evaluation needs the same derivations.
		if err := c.gitea.Do(ctx, c.owner.Token, http.MethodPost, fmt.Sprintf("/repos/%s/pulls/%d/merge", c.repo.FullName(), pr),
			map[string]string{"Do": "merge"}, nil); err != nil {
			t.Fatalf("merge: %v", err)
		}
		merged, err := c.gitea.BranchHead(ctx, c.repo, "main")
		if err != nil {
			t.Fatal(err)
		}
		c.waitStatuses(merged, "success", "success", 3*time.Minute)
		mainEval, _ := c.evalOf(merged, "main")
		if d := attrDrv(mainEval, newName); d != newDrv {
			t.Fatalf("promote %v: main's new is %s, the pull request's %s", promote, d, newDrv)
		}
		j := c.waitJob(newDrv, time.Minute, "succeeded", func(j jobRow) bool { return j.Status == status.JobSucceeded })
		switch {
		case promote && j.Attempt != attempt:
			t.Errorf("promote on: new built again (attempt %d, was %d), want it promoted as built", j.Attempt, attempt)
		case !promote && j.Attempt != attempt+1:
			t.Errorf("promote off: new at attempt %d, was %d: want it built again once", j.Attempt, attempt)
		}
		// Served to everyone, once the cache's visibility TTL has passed.
		proctest.WaitFor(t, 30*time.Second, fmt.Sprintf("promote %v: %s served anonymously", promote, newOut), func() bool {
			return narinfo(newOut, "") == http.StatusOK
		})
		c.checkSubstitutable([]string{newOut, outputOf(depDrv)})
	}
}
