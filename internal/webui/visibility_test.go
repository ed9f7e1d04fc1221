package webui

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A private repository's project is nobody's business but its readers': a logged-out visitor
// gets the same 404 as for a project that does not exist, on every page and stream.
func TestPrivateProjectsHidden(t *testing.T) {
	fx := newEvalFixture(t)
	mux := testMux(fx.u)
	secret := fx.newProject("secret", "gitea", "o/secret")
	fx.exec(`UPDATE repositories SET is_private = true WHERE full_name = 'o/secret'`)
	e := fx.newEval(secret)
	drv := fx.drv("hidden")
	fx.attr(e, "hidden", drv)
	job := fx.job(drv, jobSpec{status: status.JobFailed, node: "b1", claimed: 0, ended: 1})
	fx.exec(`UPDATE build_jobs SET project_id = $1 WHERE id = $2`, secret, job)
	public := fx.newEval(fx.project)

	for _, path := range []string{
		"/ci/secret/",
		fmt.Sprintf("/ci/secret/eval/%d", e),
		fmt.Sprintf("/ci/secret/build/%d", job),
		fmt.Sprintf("/ci/proj/build/%d", job), // the private job under a public project's URL
		fmt.Sprintf("/api/events/eval/%d", e),
	} {
		if code, body := get(t, mux, path); code != http.StatusNotFound || strings.Contains(body, "hidden") {
			t.Errorf("GET %s logged out: %d, want 404 without the project's data", path, code)
		}
	}
	code, body := get(t, mux, "/ci/")
	if code != http.StatusOK || strings.Contains(body, "secret") || !strings.Contains(body, ">proj<") {
		t.Errorf("dashboard logged out: %d; want proj listed and secret not:\n%s", code, body)
	}
	if code, _ := get(t, mux, fmt.Sprintf("/ci/proj/eval/%d", public)); code != http.StatusOK {
		t.Errorf("a public project's evaluation: %d, want 200", code)
	}

	// A derivation both projects build: the public build page lists the public evaluation
	// only, and none of the private project's names.
	shared := fx.drv("shared")
	fx.attr(public, "shared", shared)
	fx.attr(e, "shared-secretly", shared)
	sharedJob := fx.job(shared, jobSpec{status: status.JobSucceeded, node: "b1", claimed: 0, ended: 1})
	code, body = get(t, mux, fmt.Sprintf("/ci/proj/build/%d", sharedJob))
	if code != http.StatusOK || strings.Contains(body, "secret") || !strings.Contains(body, fmt.Sprintf("/ci/proj/eval/%d", public)) {
		t.Errorf("a shared build's page logged out: %d; want the public evaluation and nothing of the private one:\n%s", code, body)
	}
}
