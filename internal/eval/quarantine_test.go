package eval_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A pull request's evaluation creates its jobs untrusted; a branch's evaluation of the same
// derivations makes the unfinished ones trusted, and takes the outputs the pull request built
// (quarantined) as built if its project promotes them, or else resets their jobs to be rebuilt,
// trusted, their dependents waiting again.
func TestPullRequestJobsUntrusted(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1", func(c *eval.Config) { c.MaxEvals = 2 })

	for _, promote := range []bool{true, false} {
		name := fmt.Sprintf("quar-promote-%v", promote)
		// Each case its own derivations: the evaluations of one share them.
		ci := h.lib() + fmt.Sprintf(`
let dep = mk "dep-%[1]s" [ ]; in { inherit dep; top = mk "top-%[1]s" [ dep ]; running = mk "running-%[1]s" [ ]; }`, name)
		repo, commit := h.newProject(name, map[string]string{"ci.nix": ci, eval.SettingsFile: "pull-requests = \"head\"\n"})
		repo.Git("update-ref", "refs/pull/1/head", commit)
		pid := h.queryInt(`SELECT id FROM projects WHERE name = $1`, name)
		h.exec(`UPDATE projects SET promote_pr_outputs = $2 WHERE id = $1`, pid, promote)

		pr, created, err := evaluation.Request(h.ctx(), h.pool, evaluation.RequestParams{ProjectID: pid, FlakeURL: repo.Dir,
			Commit: commit, Branch: "pull/1", PRNumber: 1, PRBase: "main"})
		if err != nil || !created {
			t.Fatalf("%s: request: %v (created %v)", name, err, created)
		}
		h.waitSucceeded(pr.ID)
		attrs := h.attrs(pr.ID)
		dep, top, running := attrs["dep"].DrvPath, attrs["top"].DrvPath, attrs["running"].DrvPath
		trusted := func(drv string) bool {
			t.Helper()
			return h.queryInt(`SELECT count(*) FROM build_jobs WHERE drv_path = $1 AND trusted`, drv) == 1
		}
		if trusted(dep) || trusted(top) {
			t.Fatalf("%s: the pull request's jobs are trusted", name)
		}
		// The pull request builds dep, as the signer records it: quarantined.
		h.exec(`UPDATE build_jobs SET status = 'succeeded', finished_at = now() WHERE drv_path = $1`, dep)
		h.exec(`UPDATE derivation_outputs SET nar_hash = 'sha256:1111111111111111111111111111111111111111111111111111', nar_size = 1, quarantined = true
			WHERE drv_path = $1`, dep)
		if h.queryInt(`SELECT count(*) FROM build_jobs WHERE drv_path = $1 AND ready`, top) != 1 {
			t.Fatalf("%s: top is not ready once dep is built", name)
		}
		// A builder is building running for the pull request.
		h.exec(`UPDATE build_jobs SET status = 'building', claimed_by = 'some-builder', claimed_at = now(), started_at = now(),
			attempt = 1 WHERE drv_path = $1`, running)

		branch, _ := h.trigger(name, "", commit)
		h.waitSucceeded(branch.ID)
		if !trusted(top) {
			t.Errorf("%s: the branch needs top, whose job is still untrusted", name)
		}
		// The build under way counts as trusted when it completes: the same derivation.
		if !trusted(running) || h.jobStatus(running) != status.JobBuilding {
			t.Errorf("%s: running: trusted %v, %s; want trusted and still building", name, trusted(running), h.jobStatus(running))
		}
		quarantined := h.queryInt(`SELECT count(*) FROM derivation_outputs WHERE drv_path = $1 AND quarantined`, dep) == 1
		depStatus := h.jobStatus(dep)
		topReady := h.queryInt(`SELECT count(*) FROM build_jobs WHERE drv_path = $1 AND ready`, top) == 1
		if promote {
			if quarantined || depStatus != status.JobSucceeded || !topReady {
				t.Errorf("%s: dep quarantined %v, its job %s, top ready %v; want promoted without a rebuild", name, quarantined, depStatus, topReady)
			}
		} else if !quarantined || depStatus != status.JobPending || !trusted(dep) || topReady {
			t.Errorf("%s: dep quarantined %v, its job %s (trusted %v), top ready %v; want dep rebuilt, trusted, and top waiting for it",
				name, quarantined, depStatus, trusted(dep), topReady)
		}
	}
}

// A pull request's tree sets no retry policy on the jobs it shares with the branches and sends
// no cached failure back to the queue, whatever its .harmonia-ci.toml asks; a branch's does.
func TestPullRequestSetsNoRetryPolicy(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1", func(c *eval.Config) { c.MaxRetries, c.MaxRetryBackoff = 3, time.Hour })
	ci := h.lib() + `{ broken = fail "broken-policy" [ ]; }`
	settings := "pull-requests = \"head\"\nfailure-expiry = \"1m\"\n[retry]\nattempts = 3\n"
	repo, commit := h.newProject("pr-policy", map[string]string{"ci.nix": ci, eval.SettingsFile: "pull-requests = \"head\"\n"})
	pid := h.queryInt(`SELECT id FROM projects WHERE name = 'pr-policy'`)
	first, _ := h.trigger("pr-policy", "", commit)
	h.waitSucceeded(first.ID)
	drv := h.attrs(first.ID)["broken"].DrvPath
	h.exec(`UPDATE build_jobs SET status = 'failed', finished_at = now() - interval '1 hour', attempt = 1 WHERE drv_path = $1`, drv)

	prCommit := repo.Commit("the policy, in a pull request", map[string]string{eval.SettingsFile: settings})
	repo.Git("update-ref", "refs/pull/1/head", prCommit)
	pr, created, err := evaluation.Request(h.ctx(), h.pool, evaluation.RequestParams{ProjectID: pid, FlakeURL: repo.Dir,
		Commit: prCommit, Branch: "pull/1", PRNumber: 1, PRBase: "main"})
	if err != nil || !created {
		t.Fatalf("request: %v (created %v)", err, created)
	}
	h.waitSucceeded(pr.ID)
	if st, limit := h.jobStatus(drv), h.queryInt(`SELECT retry_limit FROM build_jobs WHERE drv_path = $1`, drv); st != status.JobFailed || limit != 0 {
		t.Fatalf("after the pull request's evaluation: %s with retry limit %d, want failed with 0", st, limit)
	}

	// The same settings on the branch: the old failure goes back to the queue, with the policy.
	second, _ := h.trigger("pr-policy", "", prCommit)
	h.waitSucceeded(second.ID)
	if st, limit := h.jobStatus(drv), h.queryInt(`SELECT retry_limit FROM build_jobs WHERE drv_path = $1`, drv); st != status.JobPending || limit != 2 {
		t.Errorf("after the branch's evaluation: %s with retry limit %d, want pending with 2", st, limit)
	}
}
