package webhook_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/webhook"
)

// at is a time after the stand-in's pull requests were opened.
func at(minutes int) time.Time {
	return githubtest.PRCreatedAt.Add(time.Duration(minutes) * time.Minute)
}

// commentAt is the payload of a comment written at time t on pull request n of octo/hello.
func commentAt(n int, commenter, body string, t time.Time) map[string]any {
	return githubtest.CommentPayload(githubtest.Comment{Action: "created", Repo: hello, Number: n,
		OnPullRequest: true, Commenter: commenter, Body: body, Installation: installationID, CreatedAt: t})
}

// Trust is write access: GitHub calls read and triage users (and organisation members through
// the base permission) collaborators, and none of them may have code evaluated or approve it.
func TestReadOnlyCollaborator(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		role    string
		trusted bool
	}{
		{"read", false},
		{"triage", false},
		{"write", true},
		{"maintain", true},
		{"admin", true},
	} {
		t.Run(tc.role, func(t *testing.T) {
			t.Parallel()
			b := setup(t, options{})
			b.gh.SetPermission(hello.FullName, "carol", tc.role)

			// carol's own pull request.
			own := githubtest.PR{Number: 5, User: "carol", HeadSHA: sha(5), HeadRef: "f", HeadRepo: "carol/hello"}
			b.gh.SetPullRequest(hello.FullName, own)
			got := b.deliver(t, "pull_request", pullRequest("opened", own))
			if want := fmt.Sprintf("pull request #5 by carol waits for a collaborator's %q", webhook.RunCommand); !tc.trusted && (got.code != http.StatusOK || got.msg != want) {
				t.Fatalf("%s user's pull request answered %+v; want 200 %q", tc.role, got, want)
			}
			if tc.trusted && got.code != http.StatusAccepted {
				t.Fatalf("%s user's pull request answered %+v; want 202", tc.role, got)
			}

			// carol approving a stranger's pull request.
			other := githubtest.PR{Number: 6, User: "stranger", HeadSHA: sha(6), HeadRef: "f", HeadRepo: "stranger/hello"}
			b.gh.SetPullRequest(hello.FullName, other)
			got = b.deliver(t, "issue_comment", comment(6, "carol", webhook.RunCommand))
			if want := fmt.Sprintf("%q by carol ignored: not a collaborator", webhook.RunCommand); !tc.trusted && (got.code != http.StatusOK || got.msg != want) {
				t.Fatalf("%s user's /ci run answered %+v; want 200 %q", tc.role, got, want)
			}
			if tc.trusted && got.code != http.StatusAccepted {
				t.Fatalf("%s user's /ci run answered %+v; want 202", tc.role, got)
			}
			if !tc.trusted {
				b.nothingRecorded(t)
			}
		})
	}
}

// An approval approves the head the pull request had when the comment was written: a push
// between the comment and its delivery (or a redelivery later) is not approved with it.
func TestApprovalNamesTheCommentedHead(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	pr := githubtest.PR{Number: 9, User: "stranger", HeadSHA: sha(2), HeadRef: "f", HeadRepo: "stranger/hello",
		Commits: []githubtest.Commit{{SHA: sha(1), Date: at(1)}, {SHA: sha(2), Date: at(2)}}}
	b.gh.SetPullRequest(hello.FullName, pr)
	approval := commentAt(9, "alice", "LGTM\n/ci run\n", at(3))

	// The stranger pushes before the approval is delivered.
	pr.HeadSHA = sha(3)
	pr.Commits = append(pr.Commits, githubtest.Commit{SHA: sha(3), Date: at(4)})
	b.gh.SetPullRequest(hello.FullName, pr)

	got := b.deliverID(t, "issue_comment", "c-1", approval)
	if got.code != http.StatusAccepted || got.msg != "evaluation queued" {
		t.Fatalf("approval answered %+v; want 202 evaluation queued", got)
	}
	want := evalRow{ID: got.eval, Status: status.EvalQueued, Branch: "pull/9", Commit: sha(2), FlakeURL: cloneURL,
		PRNumber: 9, PRAuthor: "stranger"}
	if es := b.evals(t); len(es) != 1 || es[0] != want {
		t.Fatalf("evaluations %+v; want only the commented head %+v", es, want)
	}

	// A redelivery under a new id, after yet another push, approves nothing new: its body was
	// seen before.
	pr.HeadSHA = sha(4)
	pr.Commits = append(pr.Commits, githubtest.Commit{SHA: sha(4), Date: at(10)})
	b.gh.SetPullRequest(hello.FullName, pr)
	got = b.deliverID(t, "issue_comment", "c-2", approval)
	if got.code != http.StatusOK || got.eval != 0 {
		t.Fatalf("redelivered approval answered %+v; want 200, a replay", got)
	}
	if es := b.evals(t); len(es) != 1 || es[0] != want {
		t.Fatalf("evaluations %+v; want only %+v", es, want)
	}

	// Force-pushed since the comment, with every commit newer than it: nothing is approved.
	force := githubtest.PR{Number: 10, User: "stranger", HeadSHA: sha(12), HeadRef: "g", HeadRepo: "stranger/hello",
		Commits: []githubtest.Commit{{SHA: sha(11), Date: at(5)}, {SHA: sha(12), Date: at(6)}}}
	b.gh.SetPullRequest(hello.FullName, force)
	got = b.deliver(t, "issue_comment", commentAt(10, "alice", webhook.RunCommand, at(3)))
	if got.code != http.StatusOK || !strings.Contains(got.msg, "no commit of pull request #10 is older than the comment") {
		t.Fatalf("approval of a head that is gone answered %+v; want 200 no commit older", got)
	}
	// A commit dated before the comment on top of one dated after it cannot have existed
	// then: the approved head is the last of the commits that all predate the comment.
	skew := githubtest.PR{Number: 11, User: "stranger", HeadSHA: sha(23), HeadRef: "h", HeadRepo: "stranger/hello",
		Commits: []githubtest.Commit{{SHA: sha(21), Date: at(1)}, {SHA: sha(22), Date: at(9)}, {SHA: sha(23), Date: at(2)}}}
	b.gh.SetPullRequest(hello.FullName, skew)
	got = b.deliver(t, "issue_comment", commentAt(11, "alice", webhook.RunCommand, at(3)))
	if got.code != http.StatusAccepted {
		t.Fatalf("approval of pull request 11 answered %+v; want 202", got)
	}
	if es := b.evals(t); len(es) != 2 || es[1].Commit != sha(21) {
		t.Fatalf("evaluations %+v; want %s for pull request 11", es, sha(21))
	}
}

// "/ci run <commit>" approves that commit, which must be one of the pull request's.
func TestRunCommandCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	c1, c2, c3 := "abcdef0"+strings.Repeat("1", 33), "abcdef0"+strings.Repeat("2", 33), strings.Repeat("3", 40)
	pr := githubtest.PR{Number: 9, User: "stranger", HeadSHA: c3, HeadRef: "f", HeadRepo: "stranger/hello",
		Commits: []githubtest.Commit{{SHA: c1, Date: at(1)}, {SHA: c2, Date: at(2)}, {SHA: c3, Date: at(9)}}}
	b.gh.SetPullRequest(hello.FullName, pr)
	for _, tc := range []struct {
		name, commenter, body string
		wantMsg               string
	}{
		{"not a commit id", "alice", "/ci run main", `"/ci run" argument "main" is not a commit id`},
		{"too short", "alice", "/ci run abcdef", `"/ci run" argument "abcdef" is not a commit id`},
		{"two arguments", "alice", "/ci run " + c2 + " " + c3, fmt.Sprintf("comment without %q", webhook.RunCommand)},
		{"not in the pull request", "alice", "/ci run " + strings.Repeat("ab", 20), strings.Repeat("ab", 20) + " is not a commit of pull request #9"},
		{"ambiguous prefix", "alice", "/ci run abcdef0", "abcdef0 names more than one commit of pull request #9"},
		{"by a stranger", "stranger", "/ci run " + c2, fmt.Sprintf("%q by stranger ignored: not a collaborator", webhook.RunCommand)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := b.deliver(t, "issue_comment", commentAt(9, tc.commenter, tc.body, at(10)))
			if got.code != http.StatusOK || got.msg != tc.wantMsg {
				t.Fatalf("answer %+v; want 200 %q", got, tc.wantMsg)
			}
			b.nothingRecorded(t)
		})
	}

	// The comment is written after c3 but names c2: c2 is what is approved.
	got := b.deliver(t, "issue_comment", commentAt(9, "alice", "/ci run "+strings.ToUpper(c2), at(10)))
	if got.code != http.StatusAccepted {
		t.Fatalf("/ci run %s answered %+v; want 202", c2, got)
	}
	if es := b.evals(t); len(es) != 1 || es[0].Commit != c2 || es[0].Branch != "pull/9" || es[0].PRAuthor != "stranger" {
		t.Fatalf("evaluations %+v; want %s on pull/9", es, c2)
	}
	// An abbreviated id names the one commit it abbreviates.
	got = b.deliver(t, "issue_comment", commentAt(9, "alice", "ok\n  /ci run 3333333  \n", at(10)))
	if got.code != http.StatusAccepted {
		t.Fatalf("/ci run 3333333 answered %+v; want 202", got)
	}
	if es := b.evals(t); len(es) != 2 || es[1].Commit != c3 {
		t.Fatalf("evaluations %+v; want %s evaluated", es, c3)
	}
}

// On synchronize, trust follows whoever pushed (the delivery's sender), not the author: a
// trusted author's pull request whose branch takes a stranger's push waits for an approval.
func TestSynchronizeTrustsThePusher(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	pr := githubtest.PR{Number: 7, User: "alice", HeadSHA: sha(1), HeadRef: "f", HeadRepo: "mallory/hello"}
	b.gh.SetPullRequest(hello.FullName, pr)
	opened := b.deliver(t, "pull_request", pullRequest("opened", pr))
	if opened.code != http.StatusAccepted {
		t.Fatalf("trusted author's pull request answered %+v; want 202", opened)
	}

	pr.HeadSHA = sha(2)
	b.gh.SetPullRequest(hello.FullName, pr)
	got := b.deliver(t, "pull_request", githubtest.PullRequestPayload(githubtest.PullRequestEvent{Action: "synchronize",
		Repo: hello, PR: pr, Sender: "mallory", Installation: installationID}))
	if want := fmt.Sprintf("pull request #7 by alice: a push by mallory waits for a collaborator's %q", webhook.RunCommand); got.code != http.StatusOK || got.msg != want {
		t.Fatalf("stranger's push answered %+v; want 200 %q", got, want)
	}
	if es := b.evals(t); len(es) != 1 || es[0].Commit != sha(1) {
		t.Fatalf("evaluations %+v; want only %s", es, sha(1))
	}

	// The author's own push is trusted.
	pr.HeadSHA = sha(3)
	b.gh.SetPullRequest(hello.FullName, pr)
	got = b.deliver(t, "pull_request", pullRequest("synchronize", pr))
	if got.code != http.StatusAccepted {
		t.Fatalf("author's push answered %+v; want 202", got)
	}
	if es := b.evals(t); len(es) != 2 || es[1].Commit != sha(3) {
		t.Fatalf("evaluations %+v; want %s evaluated", es, sha(3))
	}
}
