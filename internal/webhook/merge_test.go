package webhook_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A pull request's evaluation records its base branch, for the evaluator to merge the head into;
// once a run has merged it, the pull request's next event evaluates the same head again (the
// base may have moved), and an event for an older head leaves the newer head's evaluation be.
func TestPullRequestBase(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	pr := githubtest.PR{Number: 5, User: "octo", HeadSHA: sha(5), HeadRef: "feature", BaseRef: "release"}
	got := b.deliver(t, "pull_request", pullRequest("opened", pr))
	if got.code != http.StatusAccepted {
		t.Fatalf("opened: %+v, want 202", got)
	}
	var base string
	if err := b.pool.QueryRow(testCtx(t), `SELECT pr_base FROM evaluations WHERE id = $1`, got.eval).Scan(&base); err != nil || base != "release" {
		t.Fatalf("pr_base %q (%v), want release", base, err)
	}

	// Before any run merged it, another event finds the evaluation as it is.
	again := b.deliver(t, "pull_request", pullRequest("reopened", pr))
	if again.code != http.StatusAccepted || again.eval != got.eval || again.msg != "evaluation exists" {
		t.Fatalf("reopened before a merge: %+v, want the existing evaluation", again)
	}
	// As an evaluator leaves it after merging into the base's tip then.
	if _, err := b.pool.Exec(testCtx(t), `UPDATE evaluations SET status = 'succeeded', finished_at = now(),
    base_commit = $2, merge_commit = $3 WHERE id = $1`, got.eval, strings.Repeat("b", 40), strings.Repeat("c", 40)); err != nil {
		t.Fatal(err)
	}
	pr.Title = "reopened once more" // a new event, not a replay of the last one's body
	again = b.deliver(t, "pull_request", pullRequest("reopened", pr))
	if again.code != http.StatusAccepted || again.eval != got.eval || again.msg != "evaluation queued" {
		t.Fatalf("reopened after a merge: %+v, want the evaluation queued again", again)
	}
	var st status.EvalStatus
	var merge string
	if err := b.pool.QueryRow(testCtx(t), `SELECT status, merge_commit FROM evaluations WHERE id = $1`, got.eval).Scan(&st, &merge); err != nil || st != status.EvalQueued || merge != "" {
		t.Fatalf("evaluated again: %s, merge %q (%v); want queued, no merge yet", st, merge, err)
	}

	// A newer head; then an event naming the old head does not displace it.
	pr.HeadSHA = sha(6)
	newer := b.deliver(t, "pull_request", pullRequest("synchronize", pr))
	if newer.code != http.StatusAccepted || newer.eval == got.eval {
		t.Fatalf("synchronize: %+v, want a new evaluation", newer)
	}
	// (Finished rather than superseded: a superseded head's return is a case of its own.)
	if _, err := b.pool.Exec(testCtx(t), `UPDATE evaluations SET status = 'succeeded', error = NULL, finished_at = now(),
    base_commit = $2 WHERE id = $1`, got.eval, strings.Repeat("b", 40)); err != nil {
		t.Fatal(err)
	}
	pr.HeadSHA, pr.Title = sha(5), "back to the older head"
	old := b.deliver(t, "pull_request", pullRequest("reopened", pr))
	if old.eval != got.eval || old.msg != "evaluation exists" {
		t.Fatalf("an event for the older head: %+v, want its evaluation left as it is", old)
	}
	if err := b.pool.QueryRow(testCtx(t), `SELECT status FROM evaluations WHERE id = $1`, newer.eval).Scan(&st); err != nil || st != status.EvalQueued {
		t.Fatalf("the newer head's evaluation: %s (%v), want still queued", st, err)
	}
}
