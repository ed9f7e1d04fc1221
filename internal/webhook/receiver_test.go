package webhook_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/webhook"
)

func TestSignature(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	// The signed payload claims another clone URL: evaluations fetch from the one recorded
	// from the forge's API, never from a delivery.
	payload := push(githubtest.Repo{FullName: hello.FullName, CloneURL: "https://evil.example/x.git"}, "main", sha(1))
	body, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(secret, data []byte) string {
		m := hmac.New(sha256.New, secret)
		m.Write(data)
		return "sha256=" + hex.EncodeToString(m.Sum(nil))
	}
	tampered := []byte(strings.Replace(string(body), sha(1), sha(2), 1))
	for _, tc := range []struct {
		name   string
		header func(h http.Header) // adjusts the header GitHub would send for body
		body   []byte
	}{
		{"missing X-Hub-Signature-256", func(h http.Header) { h.Del("X-Hub-Signature-256") }, body},
		{"no signature at all", func(h http.Header) { h.Del("X-Hub-Signature-256"); h.Del("X-Hub-Signature") }, body},
		{"wrong secret", func(h http.Header) { h.Set("X-Hub-Signature-256", sign([]byte("not the secret"), body)) }, body},
		{"tampered body", func(http.Header) {}, tampered},
		{"sha1= prefix", func(h http.Header) { h.Set("X-Hub-Signature-256", h.Get("X-Hub-Signature")) }, body},
		{"empty sha256=", func(h http.Header) { h.Set("X-Hub-Signature-256", "sha256=") }, body},
		{"truncated", func(h http.Header) { h.Set("X-Hub-Signature-256", sign(b.gh.WebhookSecret, body)[:40]) }, body},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := b.gh.WebhookHeader("push", body)
			tc.header(h)
			got := b.post(t, b.url, h, tc.body)
			if got.code != http.StatusUnauthorized || got.msg != "invalid or missing webhook signature" {
				t.Fatalf("answer %+v; want 401 invalid or missing webhook signature", got)
			}
			b.nothingRecorded(t)
		})
	}

	h := b.gh.WebhookHeader("push", body)
	delivery := h.Get("X-GitHub-Delivery")
	got := b.post(t, b.url, h, body)
	if got.code != http.StatusAccepted || got.msg != "evaluation queued" || got.eval == 0 {
		t.Fatalf("valid delivery answered %+v; want 202 evaluation queued", got)
	}
	want := []evalRow{{ID: got.eval, Status: status.EvalQueued, Branch: "main", Commit: sha(1), FlakeURL: cloneURL,
		TreeHash: strings.Repeat("a", 40)}}
	if es := b.evals(t); len(es) != 1 || es[0] != want[0] {
		t.Fatalf("evaluations %+v; want %+v", es, want)
	}
	if ds := b.deliveries(t); len(ds) != 1 || ds["github:"+delivery] != got.eval {
		t.Fatalf("deliveries %v; want github:%s → %d", ds, delivery, got.eval)
	}
}

func TestRequestLimits(t *testing.T) {
	t.Parallel()
	normal, err := json.Marshal(push(hello, "main", sha(1)))
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, options{maxBody: int64(len(normal))})

	// One byte over the limit, signed correctly: refused for its size.
	big := slices.Concat(normal[:len(normal)-1], []byte(" "), normal[len(normal)-1:])
	got := b.post(t, b.url, b.gh.WebhookHeader("push", big), big)
	if want := fmt.Sprintf("delivery larger than %d bytes", len(normal)); got.code != http.StatusRequestEntityTooLarge || got.msg != want {
		t.Fatalf("oversized delivery answered %+v; want 413 %q", got, want)
	}
	b.nothingRecorded(t)

	got = b.post(t, b.base+"/webhook/gitlab", b.gh.WebhookHeader("push", normal), normal)
	if got.code != http.StatusNotFound || got.msg != `no forge named "gitlab" is configured` {
		t.Fatalf("unknown forge answered %+v; want 404", got)
	}
	b.nothingRecorded(t)

	// Exactly at the limit is fine.
	if got := b.post(t, b.url, b.gh.WebhookHeader("push", normal), normal); got.code != http.StatusAccepted {
		t.Fatalf("delivery of MaxBody bytes answered %+v; want 202", got)
	}
}

func TestNoProject(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, tc := range []struct {
		name string
		repo githubtest.Repo
		want string
	}{
		{"unknown repository", githubtest.Repo{FullName: "octo/unknown"}, "no project for octo/unknown"},
		{"discovered, not enabled", githubtest.Repo{FullName: "octo/other"}, "no project for octo/other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := b.deliver(t, "push", push(tc.repo, "main", sha(1)))
			if got.code != http.StatusOK || got.msg != tc.want {
				t.Fatalf("answer %+v; want 200 %q", got, tc.want)
			}
			b.nothingRecorded(t)
		})
	}

	t.Run("disabled", func(t *testing.T) {
		if _, err := b.enable.Disable(testCtx(t), b.repoID); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			event   string
			payload map[string]any
		}{
			{"push", push(hello, "main", sha(1))},
			{"pull_request", pullRequest("opened", githubtest.PR{Number: 1, User: "alice", HeadSHA: sha(2), HeadRef: "f"})},
			{"issue_comment", comment(1, "alice", webhook.RunCommand)},
		} {
			got := b.deliver(t, tc.event, tc.payload)
			if got.code != http.StatusOK || got.msg != "project hello is disabled" {
				t.Fatalf("%s answered %+v; want 200 project hello is disabled", tc.event, got)
			}
		}
		b.nothingRecorded(t)
	})
}

func TestIgnoredEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	tag := githubtest.PushPayload(githubtest.Push{Repo: hello, Ref: "refs/tags/v1", After: sha(1), Sender: "octo"})
	deleted := githubtest.PushPayload(githubtest.Push{Repo: hello, Ref: "refs/heads/old", After: sha(0), Deleted: true, Sender: "octo"})
	for _, tc := range []struct {
		name, event string
		payload     any
		want        string
	}{
		{"ping", "ping", map[string]any{"zen": "Keep it logically awesome.", "hook_id": 1}, "ignored ping event"},
		{"tag push", "push", tag, "ignored push event"},
		{"branch deletion", "push", deleted, "ignored push event"},
		{"closed pull request", "pull_request",
			pullRequest("closed", githubtest.PR{Number: 3, User: "alice", HeadSHA: sha(3), HeadRef: "f", State: "closed"}),
			"ignored pull_request closed event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := b.deliver(t, tc.event, tc.payload)
			if got.code != http.StatusOK || got.msg != tc.want {
				t.Fatalf("answer %+v; want 200 %q", got, tc.want)
			}
			b.nothingRecorded(t)
		})
	}
}

func TestReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	payload := push(hello, "main", sha(1))
	first := b.deliverID(t, "push", "d-1", payload)
	if first.code != http.StatusAccepted || first.msg != "evaluation queued" || first.eval == 0 {
		t.Fatalf("first delivery answered %+v; want 202 evaluation queued", first)
	}
	replay := b.deliverID(t, "push", "d-1", payload)
	if replay.code != http.StatusOK || replay.msg != "delivery d-1 was received before" {
		t.Fatalf("replayed delivery answered %+v; want 200 received before", replay)
	}
	// The delivery id is not signed: the same body under a new one is a replay too.
	again := b.deliverID(t, "push", "d-2", payload)
	if again.code != http.StatusOK || again.msg != "delivery d-2 was received before" {
		t.Fatalf("the same body under a new delivery id answered %+v; want 200 received before", again)
	}
	if es := b.evals(t); len(es) != 1 || es[0].ID != first.eval || es[0].Status != status.EvalQueued {
		t.Fatalf("evaluations %+v; want only %d, queued", es, first.eval)
	}
	want := map[string]int64{"github:d-1": first.eval}
	if ds := b.deliveries(t); fmt.Sprint(ds) != fmt.Sprint(want) {
		t.Fatalf("deliveries %v; want %v", ds, want)
	}
}

func TestPushSuperseding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		branch    string
		wantFirst status.EvalStatus
	}{
		{"main", status.EvalCancelled},
		{"release/1.x", status.EvalCancelled},
		{"gh-readonly-queue/main/pr-1-" + sha(9), status.EvalQueued},
		{"staging", status.EvalQueued},
	} {
		t.Run(tc.branch, func(t *testing.T) {
			t.Parallel()
			b := setup(t, options{})
			one := b.deliver(t, "push", push(hello, tc.branch, sha(1)))
			b.gh.SetBranch(hello.FullName, tc.branch, sha(2))
			two := b.deliver(t, "push", push(hello, tc.branch, sha(2)))
			if one.code != http.StatusAccepted || two.code != http.StatusAccepted || one.eval == two.eval {
				t.Fatalf("pushes answered %+v and %+v; want two 202 with new evaluations", one, two)
			}
			es := b.evals(t)
			if len(es) != 2 || es[0].ID != one.eval || es[1].ID != two.eval {
				t.Fatalf("evaluations %+v; want %d and %d", es, one.eval, two.eval)
			}
			wantErr := ""
			if tc.wantFirst == status.EvalCancelled {
				wantErr = fmt.Sprintf("superseded by evaluation %d", two.eval)
			}
			if es[0].Status != tc.wantFirst || es[0].Error != wantErr || es[0].Branch != tc.branch {
				t.Errorf("first evaluation %+v; want %s (error %q) on %s", es[0], tc.wantFirst, wantErr, tc.branch)
			}
			if es[1].Status != status.EvalQueued || es[1].Commit != sha(2) {
				t.Errorf("second evaluation %+v; want queued of %s", es[1], sha(2))
			}
		})
	}
}

// A branch that goes back to a commit whose evaluation was superseded (a revert, a force-push
// back) has that commit evaluated again, superseding the newer one.
func TestPushBackToSupersededCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	a := b.deliver(t, "push", push(hello, "main", sha(1)))
	b.gh.SetBranch(hello.FullName, "main", sha(2))
	bb := b.deliver(t, "push", push(hello, "main", sha(2)))
	b.gh.SetBranch(hello.FullName, "main", sha(1))
	back := b.deliver(t, "push", pushFrom(hello, "main", sha(2), sha(1)))
	if back.code != http.StatusAccepted || back.msg != "evaluation queued" || back.eval != a.eval {
		t.Fatalf("push back to %s answered %+v; want 202 evaluation queued %d", sha(1), back, a.eval)
	}
	es := b.evals(t)
	if len(es) != 2 || es[0].Status != status.EvalQueued || es[0].Error != "" ||
		es[1].Status != status.EvalCancelled || es[1].Error != fmt.Sprintf("superseded by evaluation %d", a.eval) || es[1].ID != bb.eval {
		t.Fatalf("evaluations %+v; want %d queued again and %d superseded by it", es, a.eval, bb.eval)
	}
	// A merge-queue branch never supersedes, so nothing is requeued there either.
	q := "gh-readonly-queue/main/pr-2-" + sha(3)
	one := b.deliver(t, "push", push(hello, q, sha(4)))
	if again := b.deliver(t, "push", pushFrom(hello, q, sha(3), sha(4))); again.msg != "evaluation exists" || again.eval != one.eval {
		t.Fatalf("merge-queue push again answered %+v", again)
	}
}

// A burst of pushes to one branch, delivered at once, is all answered: the branch's head is
// left queued, and every other commit was either superseded or, arriving after the head's
// evaluation, not evaluated (none is lost to a conflict between requests).
func TestBurstOfPushes(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	const n = 32
	b.gh.SetBranch(hello.FullName, "main", sha(100+n-1))
	codes := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			resp, err := b.gh.Deliver(testCtx(t), b.url, "push", push(hello, "main", sha(100+i)))
			if err != nil {
				errs[i] = err
				return
			}
			codes[i] = resp.StatusCode
			resp.Body.Close()
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || (codes[i] != http.StatusAccepted && codes[i] != http.StatusOK) {
			t.Errorf("delivery %d: %d %v, want 202 or 200", i, codes[i], errs[i])
		}
	}
	var queued []string
	for _, e := range b.evals(t) {
		switch {
		case e.Status == status.EvalQueued:
			queued = append(queued, e.Commit)
		case e.Status == status.EvalCancelled && strings.HasPrefix(e.Error, "superseded by evaluation "):
		default:
			t.Errorf("evaluation %+v; want queued or superseded", e)
		}
	}
	if len(queued) != 1 || queued[0] != sha(100+n-1) {
		t.Errorf("queued evaluations of %v, want only the head %s", queued, sha(100+n-1))
	}
}

func TestPullRequestTrust(t *testing.T) {
	t.Parallel()
	all, none, off := project.PRTrustAll, project.PRTrustNone, false
	waits := fmt.Sprintf("pull request #7 by stranger waits for a collaborator's %q", webhook.RunCommand)
	for _, tc := range []struct {
		name     string
		settings *project.Settings // nil: the defaults
		author   string
		wantCode int
		wantMsg  string
	}{
		{"collaborators: stranger waits", nil, "stranger", http.StatusOK, waits},
		{"collaborators: collaborator", nil, "alice", http.StatusAccepted, "evaluation queued"},
		{"collaborators: owner", nil, "octo", http.StatusAccepted, "evaluation queued"},
		{"all: stranger", &project.Settings{PRTrust: &all}, "stranger", http.StatusAccepted, "evaluation queued"},
		{"none: collaborator", &project.Settings{PRTrust: &none}, "alice", http.StatusOK, "project hello does not evaluate pull requests"},
		{"pr_enabled false: collaborator", &project.Settings{PREnabled: &off}, "alice", http.StatusOK, "project hello does not evaluate pull requests"},
		{"pr_enabled false, all: stranger", &project.Settings{PREnabled: &off, PRTrust: &all}, "stranger", http.StatusOK, "project hello does not evaluate pull requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, options{})
			if tc.settings != nil {
				b.configure(t, *tc.settings)
			}
			pr := githubtest.PR{Number: 7, User: tc.author, HeadSHA: sha(7), HeadRef: "feature", HeadRepo: tc.author + "/hello"}
			got := b.deliver(t, "pull_request", pullRequest("opened", pr))
			if got.code != tc.wantCode || got.msg != tc.wantMsg {
				t.Fatalf("answer %+v; want %d %q", got, tc.wantCode, tc.wantMsg)
			}
			if tc.wantCode != http.StatusAccepted {
				b.nothingRecorded(t)
				return
			}
			want := evalRow{ID: got.eval, Status: status.EvalQueued, Branch: "pull/7", Commit: sha(7), FlakeURL: cloneURL,
				PRNumber: 7, PRAuthor: tc.author}
			if es := b.evals(t); len(es) != 1 || es[0] != want {
				t.Fatalf("evaluations %+v; want %+v", es, want)
			}
			// A new head supersedes the pull request's previous evaluation.
			pr.HeadSHA = sha(8)
			next := b.deliver(t, "pull_request", pullRequest("synchronize", pr))
			if next.code != http.StatusAccepted || next.eval == got.eval {
				t.Fatalf("synchronize answered %+v; want 202 and a new evaluation", next)
			}
			es := b.evals(t)
			if len(es) != 2 || es[0].Status != status.EvalCancelled || es[1].Commit != sha(8) || es[1].Branch != "pull/7" {
				t.Fatalf("evaluations %+v; want the first cancelled, %s queued on pull/7", es, sha(8))
			}
		})
	}
}

func TestRunCommand(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	pr := githubtest.PR{Number: 9, User: "stranger", HeadSHA: sha(1), HeadRef: "feature", HeadRepo: "stranger/hello"}
	b.gh.SetPullRequest(hello.FullName, pr)
	got := b.deliver(t, "pull_request", pullRequest("opened", pr))
	if got.code != http.StatusOK || !strings.Contains(got.msg, "waits for") {
		t.Fatalf("stranger's pull request answered %+v; want 200 waits", got)
	}

	got = b.deliver(t, "issue_comment", comment(9, "stranger", webhook.RunCommand))
	if want := `"/ci run" by stranger ignored: not a collaborator`; got.code != http.StatusOK || got.msg != want {
		t.Fatalf("stranger's /ci run answered %+v; want 200 %q", got, want)
	}
	b.nothingRecorded(t)

	// The author pushed after opening; the approval is of the head as GitHub has it now.
	pr.HeadSHA = sha(2)
	b.gh.SetPullRequest(hello.FullName, pr)
	approval := comment(9, "alice", webhook.RunCommand)
	got = b.deliverID(t, "issue_comment", "c-1", approval)
	if got.code != http.StatusAccepted || got.msg != "evaluation queued" {
		t.Fatalf("collaborator's /ci run answered %+v; want 202 evaluation queued", got)
	}
	approved := evalRow{ID: got.eval, Status: status.EvalQueued, Branch: "pull/9", Commit: sha(2), FlakeURL: cloneURL,
		PRNumber: 9, PRAuthor: "stranger"}
	if es := b.evals(t); len(es) != 1 || es[0] != approved {
		t.Fatalf("evaluations %+v; want %+v", es, approved)
	}

	// A later push needs another approval.
	pr.HeadSHA = sha(3)
	b.gh.SetPullRequest(hello.FullName, pr)
	got = b.deliver(t, "pull_request", pullRequest("synchronize", pr))
	if got.code != http.StatusOK || !strings.Contains(got.msg, "waits for") {
		t.Fatalf("push after the approval answered %+v; want 200 waits", got)
	}
	// Replaying the approval must not approve the newer head.
	got = b.deliverID(t, "issue_comment", "c-1", approval)
	if got.code != http.StatusOK || got.msg != "delivery c-1 was received before" {
		t.Fatalf("replayed approval answered %+v; want 200 received before", got)
	}
	if es := b.evals(t); len(es) != 1 || es[0] != approved {
		t.Fatalf("evaluations %+v; want only %+v", es, approved)
	}

	for _, tc := range []struct {
		name    string
		payload map[string]any
		want    string
	}{
		{"comment on an issue", githubtest.CommentPayload(githubtest.Comment{Action: "created", Repo: hello, Number: 10,
			Commenter: "alice", Body: webhook.RunCommand, Installation: installationID}), "ignored issue_comment created event"},
		{"edited comment", githubtest.CommentPayload(githubtest.Comment{Action: "edited", Repo: hello, Number: 9,
			OnPullRequest: true, Commenter: "alice", Body: webhook.RunCommand, Installation: installationID}), "ignored issue_comment edited event"},
		{"no command", comment(9, "alice", "please /ci run this"), fmt.Sprintf("comment without %q", webhook.RunCommand)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := b.deliver(t, "issue_comment", tc.payload)
			if got.code != http.StatusOK || got.msg != tc.want {
				t.Fatalf("answer %+v; want 200 %q", got, tc.want)
			}
			if es := b.evals(t); len(es) != 1 {
				t.Fatalf("evaluations %+v; want only the approved one", es)
			}
		})
	}

	// A new approval, the command on a line of its own, evaluates the current head and
	// supersedes the older one.
	got = b.deliver(t, "issue_comment", comment(9, "alice", "Looks fine.\n\n  /ci run  \nthanks"))
	if got.code != http.StatusAccepted {
		t.Fatalf("second approval answered %+v; want 202", got)
	}
	es := b.evals(t)
	if len(es) != 2 || es[0].Status != status.EvalCancelled || es[1].Commit != sha(3) || es[1].Branch != "pull/9" || es[1].PRAuthor != "stranger" {
		t.Fatalf("evaluations %+v; want %s cancelled and %s queued on pull/9", es, sha(2), sha(3))
	}

	// An approval of a closed pull request does nothing.
	pr.State = "closed"
	b.gh.SetPullRequest(hello.FullName, pr)
	got = b.deliver(t, "issue_comment", comment(9, "alice", webhook.RunCommand))
	if got.code != http.StatusOK || got.msg != "pull request #9 is closed" {
		t.Fatalf("approval of a closed pull request answered %+v; want 200 closed", got)
	}
	if es := b.evals(t); len(es) != 2 {
		t.Fatalf("evaluations %+v; want still 2", es)
	}
}

func TestInstallation(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	got := b.deliver(t, "installation", githubtest.InstallationPayload("created", 43, "octo", githubtest.Repo{FullName: "octo/new"}))
	if got.code != http.StatusAccepted || got.msg != "repository discovery started" {
		t.Fatalf("installation event answered %+v; want 202 repository discovery started", got)
	}
	select {
	case name := <-b.changed:
		if name != "github" {
			t.Fatalf("OnRepositoriesChanged(%q); want github", name)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnRepositoriesChanged was not called within 10s")
	}
	b.nothingRecorded(t)
}

func TestForgeUnavailable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, event string
		payload     map[string]any
		wantMsg     string
	}{
		{"pull request author", "pull_request",
			pullRequest("opened", githubtest.PR{Number: 4, User: "alice", HeadSHA: sha(4), HeadRef: "f"}),
			"could not check the sender's access with the forge; deliver again later"},
		{"commenter", "issue_comment", comment(4, "alice", webhook.RunCommand),
			"could not check the commenter with the forge; deliver again later"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, options{})
			b.gh.SetPullRequest(hello.FullName, githubtest.PR{Number: 4, User: "alice", HeadSHA: sha(4), HeadRef: "f"})
			b.down.Store(true)
			got := b.deliverID(t, tc.event, "r-1", tc.payload)
			if got.code != http.StatusBadGateway || got.msg != tc.wantMsg {
				t.Fatalf("answer %+v; want 502 %q", got, tc.wantMsg)
			}
			b.nothingRecorded(t)

			// Nothing was recorded, so GitHub's redelivery is acted on once the forge is back.
			b.down.Store(false)
			got = b.deliverID(t, tc.event, "r-1", tc.payload)
			if got.code != http.StatusAccepted || got.msg != "evaluation queued" {
				t.Fatalf("redelivery answered %+v; want 202 evaluation queued", got)
			}
			if ds := b.deliveries(t); len(ds) != 1 || ds["github:r-1"] != got.eval {
				t.Fatalf("deliveries %v; want github:r-1 → %d", ds, got.eval)
			}
		})
	}
}
