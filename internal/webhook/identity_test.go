package webhook_test

import (
	"net/http"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/webhook"
)

// A pull request's evaluation records its author's forge user id: from the delivery, and from
// the forge's pull request when a /ci run approves it.
func TestPRAuthorIDRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	authorID := func(eval int64) int64 {
		t.Helper()
		var id int64
		if err := b.pool.QueryRow(testCtx(t), `SELECT COALESCE(pr_author_id, 0) FROM evaluations WHERE id = $1`, eval).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	opened := githubtest.PR{Number: 7, User: "alice", HeadSHA: sha(7), HeadRef: "feature", HeadRepo: "alice/hello"}
	got := b.deliver(t, "pull_request", pullRequest("opened", opened))
	if got.code != http.StatusAccepted {
		t.Fatalf("collaborator's pull request answered %+v; want 202", got)
	}
	if id, want := authorID(got.eval), b.gh.UserID("alice"); id != want {
		t.Errorf("opened pull request's author id %d, want %d", id, want)
	}

	approved := githubtest.PR{Number: 9, User: "stranger", HeadSHA: sha(1), HeadRef: "feature", HeadRepo: "stranger/hello"}
	b.gh.SetPullRequest(hello.FullName, approved)
	got = b.deliver(t, "issue_comment", comment(9, "alice", webhook.RunCommand))
	if got.code != http.StatusAccepted {
		t.Fatalf("collaborator's /ci run answered %+v; want 202", got)
	}
	if id, want := authorID(got.eval), b.gh.UserID("stranger"); id != want {
		t.Errorf("approved pull request's author id %d, want %d", id, want)
	}
}
