package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/harmonia-ci/harmonia-ci/internal/browsertest"
	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A pull request's author writes, as an attribute, the very derivation another project is
// building (the same Nix expression is the same .drv), logs in through Gitea and cancels that
// build through the real frontend: the other project's build goes on and finishes, with its
// dependent. The author can still cancel their own job, and their rebuild of it gets the
// normal priority, not the admin's boost.
func TestPullRequestAuthorActsOnlyOnOwnJobs(t *testing.T) {
	u := newUICluster(t)
	ctx := context.Background()
	salt := uniqueSalt(t)
	const long = `sh "long" [] "/bin/sleep 60"`

	// The victim: the owner's other public project builds long, and after, which needs it.
	lib, err := u.gitea.CreateRepo(ctx, u.owner, giteatest.UniqueName("lib"), false)
	if err != nil {
		t.Fatal(err)
	}
	u.push(u.owner, lib, "main", map[string]string{"README": "lib\n"}, false)
	var libID int64
	proctest.WaitFor(t, 30*time.Second, "the second repository discovered", func() bool {
		return u.pool.QueryRow(ctx, `SELECT id FROM repositories WHERE full_name = $1`, lib.FullName()).Scan(&libID) == nil
	})
	if code, out := u.admin("front-1", http.MethodPost, fmt.Sprintf("/api/projects/%d/enable", libID), nil); code != http.StatusOK {
		t.Fatalf("enable the second repository: %d %s", code, out)
	}
	victim := u.push(u.owner, lib, "main", map[string]string{"ci.nix": shLib(salt) +
		` let long = ` + long + `; in { inherit long; after = sh "after" [ long ] "true"; }`}, false)
	victimEval, _ := u.evalOf(victim, "main")
	var longID int64
	proctest.WaitFor(t, 2*time.Minute, "the victim's long build running", func() bool {
		var s status.JobStatus
		err := u.pool.QueryRow(ctx, `SELECT j.id, j.status FROM eval_attrs a JOIN build_jobs j ON j.drv_path = a.drv_path
WHERE a.eval_id = $1 AND a.attr = 'long'`, victimEval).Scan(&longID, &s)
		return err == nil && s == status.JobBuilding
	})

	// The attacker's pull request names the same derivation, approved by the owner.
	bob, err := u.gitea.CreateUser(ctx, giteatest.UniqueName("bob"))
	if err != nil {
		t.Fatal(err)
	}
	fork, err := u.gitea.Fork(ctx, u.repo, bob)
	if err != nil {
		t.Fatal(err)
	}
	// The branch shares main's history, as a real pull request's does: it is evaluated merged.
	if err := u.gitea.CreateBranch(ctx, fork, bob, "feature", "main"); err != nil {
		t.Fatal(err)
	}
	head := u.push(bob, fork, "feature", map[string]string{"ci.nix": shLib(salt) +
		` { stolen = ` + long + `; own = sh "own" [] "/bin/sleep 60"; }`}, false)
	pr, err := u.gitea.CreatePullRequest(ctx, bob, u.repo, "main", fork, "feature", "a change")
	if err != nil {
		t.Fatal(err)
	}
	u.waitLog("front-1", fmt.Sprintf("pull request #%d by %s waits for a collaborator", pr, bob.Login), 1)
	if err := u.gitea.Comment(ctx, u.repo, u.owner, pr, "/ci run"); err != nil {
		t.Fatal(err)
	}
	prEval, _ := u.evalOf(head, fmt.Sprintf("pull/%d", pr))
	var stolenJob, ownJob int64
	proctest.WaitFor(t, 2*time.Minute, "the pull request's attributes", func() bool {
		err := u.pool.QueryRow(ctx, `SELECT
  (SELECT j.id FROM eval_attrs a JOIN build_jobs j ON j.drv_path = a.drv_path WHERE a.eval_id = $1 AND a.attr = 'stolen'),
  (SELECT j.id FROM eval_attrs a JOIN build_jobs j ON j.drv_path = a.drv_path WHERE a.eval_id = $1 AND a.attr = 'own')`,
			prEval).Scan(&stolenJob, &ownJob)
		return err == nil
	})
	if stolenJob != longID {
		t.Fatalf("the pull request's stolen attribute is job %d, the victim's long build %d: not shared", stolenJob, longID)
	}

	b := browsertest.New(t, browsertest.WithTimeout(3*time.Minute))
	u.login(b, bob)
	b.Navigate(u.evalPage(prEval))
	post := func(path string) int {
		t.Helper()
		code, err := chromedp.Run(b.Ctx, chromedp.Evaluate[int](fmt.Sprintf(`(async () => {
  const csrf = document.querySelector("header form input[name=csrf]").value;
  const r = await fetch(%q, {method: "POST", headers: {"X-CSRF-Token": csrf}});
  return r.status;
})()`, path), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	jobState := func(id int64) (s status.JobStatus, priority int) {
		t.Helper()
		if err := u.pool.QueryRow(ctx, `SELECT status, priority FROM build_jobs WHERE id = $1`, id).Scan(&s, &priority); err != nil {
			t.Fatal(err)
		}
		return s, priority
	}

	if s, _ := jobState(longID); s != status.JobBuilding {
		t.Fatalf("the victim's build is %s before the attack: the test was too slow to see it", s)
	}
	if code := post(fmt.Sprintf("/api/builds/%d/cancel", longID)); code != http.StatusOK && code != http.StatusForbidden {
		t.Errorf("the author cancels the victim's build: %d, want 200 (a detach) or 403", code)
	}
	if s, _ := jobState(longID); s == status.JobCancelled {
		t.Fatal("the pull request's author cancelled another project's running build")
	}

	// Their own job, which nothing else needs, they may cancel, and rebuild at normal priority.
	if code := post(fmt.Sprintf("/api/builds/%d/cancel", ownJob)); code != http.StatusOK {
		t.Errorf("the author cancels their own job: %d, want 200", code)
	}
	if s, _ := jobState(ownJob); s != status.JobCancelled {
		t.Errorf("the author's own job is %s after their cancel, want cancelled", s)
	}
	if code := post(fmt.Sprintf("/api/builds/%d/rebuild", ownJob)); code != http.StatusOK {
		t.Errorf("the author rebuilds their own job: %d, want 200", code)
	}
	if s, p := jobState(ownJob); s == status.JobCancelled || p != 0 {
		t.Errorf("the author's rebuilt job: %s at priority %d, want queued again at 0", s, p)
	}

	// The victim's build finishes, and so does what it was for.
	proctest.WaitFor(t, 3*time.Minute, "the victim's builds finished", func() bool {
		var done int
		_ = u.pool.QueryRow(ctx, `SELECT count(*) FROM eval_attrs a JOIN build_jobs j ON j.drv_path = a.drv_path
WHERE a.eval_id = $1 AND j.status IN ('succeeded', 'failed', 'cancelled', 'dep-failed')`, victimEval).Scan(&done)
		return done == 2
	})
	for _, attr := range []string{"long", "after"} {
		var s status.JobStatus
		if err := u.pool.QueryRow(ctx, `SELECT j.status FROM eval_attrs a JOIN build_jobs j ON j.drv_path = a.drv_path
WHERE a.eval_id = $1 AND a.attr = $2`, victimEval, attr).Scan(&s); err != nil || s != status.JobSucceeded {
			t.Errorf("the victim's %s: %s (%v), want succeeded", attr, s, err)
		}
	}
}
