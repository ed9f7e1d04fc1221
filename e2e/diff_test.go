package e2e

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/apiv1"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Four evaluations of one branch with real Nix: each one's diff against the one before (a
// fix, a break, a removed and a new attribute; then a failure carried over; then everything
// fixed) agrees with the attributes' statuses, the same read from the database and over the
// API; the badge and the latest links follow the branch from failing to passing, and a
// private project answers neither to anyone who may not read it.
func TestEvaluationDiffsBadgesAndLatestForReal(t *testing.T) {
	c := newBuildCluster(t, buildClusterOptions{builders: 1, frontendEnv: []string{"HARMONIA_ADMIN_TOKEN=" + adminToken}})
	r := &remoteCLI{t: t, server: c.endpoint("front-1"), token: remoteToken(t, c), home: t.TempDir()}
	salt := uniqueSalt(t)

	type want struct {
		watchExit int
		statuses  map[string]status.JobStatus
		diff      evaluation.Diff // Against is filled in from the evaluations
	}
	steps := []struct {
		ci   string
		want want
	}{
		{`{ a = mk "a" [ ]; b = fail "b" [ ]; c = mk "c" [ ]; gone = mk "gone" [ ]; }`,
			want{1, map[string]status.JobStatus{"a": status.JobSucceeded, "b": status.JobFailed, "c": status.JobSucceeded, "gone": status.JobSucceeded},
				evaluation.Diff{}}},
		{`{ a = mk "a" [ ]; b = mk "b" [ ]; c = fail "c" [ ]; fresh = mk "fresh" [ ]; }`,
			want{1, map[string]status.JobStatus{"a": status.JobSucceeded, "b": status.JobSucceeded, "c": status.JobFailed, "fresh": status.JobSucceeded},
				evaluation.Diff{NewlyFailing: []string{"c"}, NewlyFixed: []string{"b"}, Added: []string{"fresh"}, Removed: []string{"gone"}}}},
		{`{ a = mk "a" [ ]; b = mk "b" [ ]; c = fail "c" [ ]; fresh = mk "fresh" [ ]; extra = fail "extra" [ ]; }`,
			want{1, map[string]status.JobStatus{"a": status.JobSucceeded, "b": status.JobSucceeded, "c": status.JobFailed, "fresh": status.JobSucceeded, "extra": status.JobFailed},
				evaluation.Diff{StillFailing: []string{"c"}, Added: []string{"extra"}, AddedFailing: []string{"extra"}}}},
		{`{ a = mk "a" [ ]; b = mk "b" [ ]; c = mk "c" [ ]; fresh = mk "fresh" [ ]; }`,
			want{0, map[string]status.JobStatus{"a": status.JobSucceeded, "b": status.JobSucceeded, "c": status.JobSucceeded, "fresh": status.JobSucceeded},
				evaluation.Diff{NewlyFixed: []string{"c"}, Removed: []string{"extra"}}}},
	}
	front := c.endpoint("front-1")
	var prev int64
	for i, step := range steps {
		c.repo.Commit(fmt.Sprintf("step %d", i+1), map[string]string{"ci.nix": nixtest.Lib(salt) + step.ci})
		id := evalID(t, c.cli.ok("eval", c.project))
		arg := strconv.FormatInt(id, 10)
		r.expect(step.want.watchExit, "watch", arg)

		var e apiv1.EvaluationDetail
		decodeJSONOutput(t, r.expect(0, "eval", "show", arg, "--json"), &e)
		got := map[string]status.JobStatus{}
		for _, a := range e.Attributes {
			got[a.Name] = status.JobStatus(a.Status)
		}
		if fmt.Sprint(got) != fmt.Sprint(step.want.statuses) {
			t.Fatalf("evaluation %d (step %d): attributes %v, want %v", id, i+1, got, step.want.statuses)
		}

		wantDiff := step.want.diff
		wantDiff.Against = prev
		var remote, local evaluation.Diff
		decodeJSONOutput(t, r.expect(0, "eval", "show", arg, "--diff", "--json"), &remote)
		decodeJSONOutput(t, c.cli.ok("eval", "show", arg, "--diff", "--json"), &local)
		for from, d := range map[string]evaluation.Diff{"over the API": remote, "from the database": local} {
			if !sameDiff(d, wantDiff) {
				t.Errorf("step %d: the diff %s is %+v, want %+v", i+1, from, d, wantDiff)
			}
		}
		// Each name in the diff has the status its category says.
		for _, n := range slices.Concat(remote.NewlyFailing, remote.StillFailing, remote.AddedFailing) {
			if got[n] != status.JobFailed {
				t.Errorf("step %d: %s is listed as failing, its status is %s", i+1, n, got[n])
			}
		}
		for _, n := range remote.NewlyFixed {
			if got[n] != status.JobSucceeded {
				t.Errorf("step %d: %s is listed as fixed, its status is %s", i+1, n, got[n])
			}
		}
		if i == 2 {
			if out := r.expect(0, "eval", "show", arg, "--diff"); !strings.Contains(out, fmt.Sprintf("against evaluation %d: 1 new and failing\n", prev)) ||
				!strings.Contains(out, "still failing  c\n") || !strings.Contains(out, "new, failing   extra\n") {
				t.Errorf("eval show --diff's summary:\n%s", out)
			}
			// Failing: the badge says so; the latest link of an attribute that never
			// succeeded leads nowhere, that of one that did (c, in the first evaluation) to
			// its latest succeeded build.
			checkBadge(t, front, c.project, "", http.StatusOK, "failing")
			checkBadge(t, front, c.project, "?attr=a", http.StatusOK, "passing")
			checkLatest(t, front, c.project, "extra", http.StatusNotFound, "")
			checkLatest(t, front, c.project, "c", http.StatusFound, "/ci/"+c.project+"/build/")
			checkLatest(t, front, c.project, "a", http.StatusFound, "/ci/"+c.project+"/build/")
		}
		prev = id
	}
	checkBadge(t, front, c.project, "", http.StatusOK, "passing")
	checkLatest(t, front, c.project, "c", http.StatusFound, "/ci/"+c.project+"/build/")
	checkLatest(t, front, c.project, "c/output", http.StatusFound, ".narinfo")

	// Private: the same 404 as for a project that does not exist, to an anonymous visitor.
	c.cli.ok("project", "set", c.project, "--private=true")
	for _, p := range []string{"/badge.svg", "/badge.json", "/latest/c", "/latest/c/output"} {
		code, _ := noRedirectGet(t, front+"/ci/"+c.project+p, "")
		missing, _ := noRedirectGet(t, front+"/ci/no-such-project"+p, "")
		if code != http.StatusNotFound || missing != http.StatusNotFound {
			t.Errorf("GET %s of the private project anonymously: %d (a missing project: %d), want 404", p, code, missing)
		}
	}
	if code, body := noRedirectGet(t, front+"/ci/"+c.project+"/badge.json", adminToken); code != http.StatusOK || !strings.Contains(body, "passing") {
		t.Errorf("the private project's badge.json for the admin: %d %s", code, body)
	}
}

// sameDiff compares two diffs, an empty list equal to none.
func sameDiff(a, b evaluation.Diff) bool {
	return a.Against == b.Against && slices.Equal(a.NewlyFailing, b.NewlyFailing) && slices.Equal(a.NewlyFixed, b.NewlyFixed) &&
		slices.Equal(a.StillFailing, b.StillFailing) && slices.Equal(a.Added, b.Added) &&
		slices.Equal(a.AddedFailing, b.AddedFailing) && slices.Equal(a.Removed, b.Removed)
}

// noRedirectGet GETs url (with token as bearer if set) without following a redirect, and
// returns the status and the body, or the Location of a redirect.
func noRedirectGet(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if loc := resp.Header.Get("Location"); loc != "" {
		return resp.StatusCode, loc
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// checkBadge fails unless the project's badge (query: "" or "?attr=…") answers code saying
// message, as SVG and as shields.io JSON.
func checkBadge(t *testing.T, front, project, query string, code int, message string) {
	t.Helper()
	for _, kind := range []string{"badge.svg", "badge.json"} {
		got, body := noRedirectGet(t, front+"/ci/"+project+"/"+kind+query, "")
		if got != code || !strings.Contains(body, message) {
			t.Errorf("GET %s%s: %d %s, want %d saying %q", kind, query, got, body, code, message)
		}
	}
}

// checkLatest fails unless the project's latest link of attr answers code, redirecting to a
// location that contains to.
func checkLatest(t *testing.T, front, project, attr string, code int, to string) {
	t.Helper()
	got, loc := noRedirectGet(t, front+"/ci/"+project+"/latest/"+attr, "")
	if got != code || (code == http.StatusFound && !strings.Contains(loc, to)) {
		t.Errorf("GET latest/%s: %d %s, want %d to …%s…", attr, got, loc, code, to)
	}
}
