package webui

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Badges and "latest" links say what the latest evaluation of a branch says, per attribute
// too, and send download scripts to the latest succeeded build; a private project's are
// nobody else's.
func TestBadgesAndLatestLinks(t *testing.T) {
	fx := newEvalFixture(t)
	commit := 0
	eval := func(project int64, st status.EvalStatus) int64 {
		commit++
		return fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status)
VALUES ($1, 'x', $2, 'main', $3) RETURNING id`, project, fmt.Sprintf("%040d", commit), st)
	}
	built := func(e int64, attr string, st status.JobStatus) (string, int64) {
		d := fx.drv(attr)
		fx.attr(e, attr, d)
		fx.exec(`INSERT INTO derivation_outputs (drv_path, output_name, output_path) VALUES ($1, 'out', $2)`,
			d, strings.TrimSuffix(d, ".drv")+"-out")
		return d, fx.job(d, jobSpec{status: st, node: "b1", claimed: 0, ended: 1})
	}

	// The first evaluation: ok built, cached had nothing to build, broken failed.
	first := eval(fx.project, status.EvalSucceeded)
	okDrv, okJob := built(first, "ok", status.JobSucceeded)
	cached := fx.drv("cached")
	fx.attr(first, "cached", cached)
	built(first, "broken", status.JobFailed)

	badge := func(query string) Badge {
		t.Helper()
		body := fx.get("/ci/proj/badge.json"+query, http.StatusOK)
		var b struct {
			SchemaVersion int    `json:"schemaVersion"`
			Label         string `json:"label"`
			Message       string `json:"message"`
			Color         string `json:"color"`
		}
		if err := json.Unmarshal([]byte(body), &b); err != nil || b.SchemaVersion != 1 || b.Label != badgeLabel {
			t.Fatalf("badge.json%s: %s (%v); want a shields.io endpoint", query, body, err)
		}
		return Badge{b.Message, b.Color}
	}
	for _, tt := range []struct {
		query string
		want  Badge
	}{
		{"", Badge{"failing", "red"}},
		{"?attr=ok", Badge{"passing", "brightgreen"}},
		{"?attr=cached", Badge{"passing", "brightgreen"}},
		{"?attr=broken", Badge{"failing", "red"}},
		{"?attr=nope", Badge{"no such attribute", "lightgrey"}},
		{"?branch=other", Badge{"no evaluation", "lightgrey"}},
	} {
		if got := badge(tt.query); got != tt.want {
			t.Errorf("badge%s: %+v, want %+v", tt.query, got, tt.want)
		}
	}
	svg := fx.get("/ci/proj/badge.svg?attr=ok", http.StatusOK)
	if !strings.HasPrefix(svg, "<svg") || !strings.Contains(svg, "<title>harmonia-ci: passing</title>") || !strings.Contains(svg, "#4c1") {
		t.Errorf("badge.svg?attr=ok: %s", svg)
	}

	redirect := func(path string) (int, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		fx.h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil))
		return rec.Code, rec.Header().Get("Location")
	}
	okHash := strings.TrimPrefix(okDrv, "/nix/store/")[:32]
	for _, tt := range []struct {
		path, to string
		code     int
	}{
		{"/ci/proj/latest/ok", fmt.Sprintf("/ci/proj/build/%d", okJob), http.StatusFound},
		{"/ci/proj/latest/ok/output", "/" + okHash + ".narinfo", http.StatusFound},
		{"/ci/proj/latest/cached", fmt.Sprintf("/ci/proj/eval/%d", first), http.StatusFound},
		{"/ci/proj/latest/broken", "", http.StatusNotFound},
		{"/ci/proj/latest/nope", "", http.StatusNotFound},
	} {
		if code, to := redirect(tt.path); code != tt.code || to != tt.to {
			t.Errorf("GET %s: %d to %q; want %d to %q", tt.path, code, to, tt.code, tt.to)
		}
	}

	// A newer evaluation where ok broke: the badge follows it, the latest link stays on the
	// last good build; while one runs, the badge says so.
	second := eval(fx.project, status.EvalSucceeded)
	built(second, "ok", status.JobFailed)
	if got := badge("?attr=ok"); got != (Badge{"failing", "red"}) {
		t.Errorf("badge of ok after it broke: %+v", got)
	}
	if code, to := redirect("/ci/proj/latest/ok"); code != http.StatusFound || to != fmt.Sprintf("/ci/proj/build/%d", okJob) {
		t.Errorf("latest ok after it broke: %d to %q; want the first build", code, to)
	}
	eval(fx.project, status.EvalRunning)
	if got := badge(""); got != (Badge{"evaluating", "yellow"}) {
		t.Errorf("badge while evaluating: %+v", got)
	}

	// A private project: the same 404 as a project that does not exist.
	secret := fx.newProject("secret", "gitea", "o/secret")
	fx.exec(`UPDATE repositories SET is_private = true WHERE full_name = 'o/secret'`)
	e := eval(secret, status.EvalSucceeded)
	built(e, "ok", status.JobSucceeded)
	for _, path := range []string{"/ci/secret/badge.svg", "/ci/secret/badge.json", "/ci/secret/latest/ok", "/ci/secret/latest/ok/output"} {
		if code, body := get(t, fx.h, path); code != http.StatusNotFound || strings.Contains(body, "passing") {
			t.Errorf("GET %s logged out: %d, want 404", path, code)
		}
	}
}

// An attribute's history lists its results over the branch's evaluations, newest first, and
// draws its build times.
func TestAttrHistory(t *testing.T) {
	fx := newEvalFixture(t)
	var evals []int64
	for i, st := range []status.JobStatus{status.JobSucceeded, status.JobFailed, status.JobSucceeded} {
		e := fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status)
VALUES ($1, 'x', $2, 'main', 'succeeded') RETURNING id`, fx.project, strings.Repeat(fmt.Sprint(i+1), 40))
		evals = append(evals, e)
		d := fx.drv(fmt.Sprint("hello-", i))
		fx.attr(e, "hello", d)
		fx.job(d, jobSpec{status: st, node: fmt.Sprint("b", i), claimed: 0, ended: time.Duration(i+1) * time.Minute})
	}
	pr := fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, pr_number)
VALUES ($1, 'x', repeat('9', 40), 'pull/1', 'succeeded', 1) RETURNING id`, fx.project)
	fx.attr(pr, "hello", fx.drv("hello-pr"))

	body := fx.get("/ci/proj/attr/hello", http.StatusOK)
	rows := regexp.MustCompile(`<a href="/ci/proj/eval/(\d+)">#`).FindAllStringSubmatch(body, -1)
	var got []string
	for _, r := range rows {
		got = append(got, r[1])
	}
	want := []string{fmt.Sprint(evals[2]), fmt.Sprint(evals[1]), fmt.Sprint(evals[0])}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("history rows: evaluations %v, want %v (newest first, no pull request's)", got, want)
	}
	bars := regexp.MustCompile(`<rect x="[^"]*" y="[^"]*" width="[^"]*" height="([^"]*)" fill="([^"]*)"><title>evaluation #(\d+)`).FindAllStringSubmatch(body, -1)
	if len(bars) != 3 || bars[0][3] != fmt.Sprint(evals[0]) || bars[1][2] != chartFailedColor || bars[2][1] != "78" {
		t.Errorf("chart bars %q; want three, oldest first, the failed one red, the longest full height", bars)
	}
	for _, want := range []string{"b0", "b2", "3m00s"} {
		if !strings.Contains(body, want) {
			t.Errorf("history lacks %q", want)
		}
	}
	fx.get("/ci/proj/attr/nope", http.StatusNotFound)
	if code, _ := get(t, fx.h, "/ci/proj/attr/hello?branch=pull/1"); code != http.StatusNotFound {
		t.Errorf("a pull request's branch: %d, want 404 (pull requests are not a branch's history)", code)
	}
	// The evaluation page links each attribute to its history.
	if body := fx.get(fmt.Sprintf("/ci/proj/eval/%d", evals[0]), http.StatusOK); !strings.Contains(body, `href="/ci/proj/attr/hello"`) {
		t.Error("the evaluation page does not link hello's history")
	}
}
