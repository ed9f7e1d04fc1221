package webui

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// restart replaces the fixture's UI by a new one whose [auth] admins are admins, on the same
// database and stand-in GitHub: a frontend restarted with a new configuration.
func (fx *authFixture) restart(admins ...string) {
	fx.t.Helper()
	old := fx.u.cfg
	u, err := New(Config{Pool: fx.pool, Forges: old.Forges, Logger: slog.New(slog.NewTextHandler(fx.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
		Secret: old.Secret, Admins: admins, AdminToken: old.AdminToken, OAuth: map[string]forge.OAuth{"github": old.OAuth["github"]}})
	if err != nil {
		fx.t.Fatal(err)
	}
	srv := httptest.NewServer(testMux(u))
	fx.t.Cleanup(srv.Close)
	fx.u, fx.srv = u, srv
}

// resolveAdmins makes the UI look the [auth] admins' logins up again now, as it does every
// PermissionTTL.
func (fx *authFixture) resolveAdmins() {
	fx.u.auth.admins.refresh(fx.ctx)
}

// settings is the status of the admins-only settings page for b: 200 for an admin.
func (b *browser) settings() int {
	resp, _ := b.get("/ci/settings/projects")
	return resp.StatusCode
}

// An [auth] admin is the forge user who had the configured login, not whoever has it now.
func TestRenamedAdmin(t *testing.T) {
	t.Parallel()
	fx := newAuthFixture(t) // admins: github:boss
	boss := fx.browser().login("boss")
	if got := boss.settings(); got != http.StatusOK {
		t.Fatalf("the admin opens the settings: %d, want 200", got)
	}

	// boss renames their account: the configuration's "boss" is nobody now.
	fx.gh.RenameUser("boss", "boss2")
	fx.resolveAdmins()
	if got := boss.settings(); got != http.StatusForbidden {
		t.Errorf("the renamed admin's session opens the settings: %d, want 403", got)
	}
	boss2 := fx.browser().login("boss2")
	if got := boss2.settings(); got != http.StatusForbidden {
		t.Errorf("the renamed admin logged in again opens the settings: %d, want 403 until the configuration names boss2", got)
	}

	// Someone else takes the login "boss": not admin.
	fx.gh.CreateUser("boss")
	fx.resolveAdmins()
	squatter := fx.browser().login("boss")
	if got := squatter.settings(); got != http.StatusForbidden {
		t.Errorf("the new holder of the login boss opens the settings: %d, want 403", got)
	}

	// The configuration names the new login (a restart with it): boss2 is admin again, the
	// new holder of "boss" is not, and the old entry's binding is gone.
	fx.restart("github:boss2")
	if got := fx.browser().login("boss2").settings(); got != http.StatusOK {
		t.Errorf("boss2 named by the configuration opens the settings: %d, want 200", got)
	}
	if got := fx.browser().login("boss").settings(); got != http.StatusForbidden {
		t.Errorf("the new holder of boss after the restart: %d, want 403", got)
	}
	if got := fx.str(`SELECT string_agg(login || '=' || user_id, ',') FROM admin_logins`); got != fmt.Sprintf("boss2=%d", fx.gh.UserID("boss2")) {
		t.Errorf("admin bindings %q, want only boss2's", got)
	}

	// An entry configured afresh (its old binding gone with the restart that dropped it) is
	// bound to whoever holds the login when it is first resolved: the operator named them.
	fx.restart("github:boss2", "github:BOSS")
	if got := fx.browser().login("boss").settings(); got != http.StatusOK {
		t.Errorf("a newly configured login, first resolved now: %d, want 200", got)
	}
}

// A pull request's author owns its evaluation by forge user id: a rename keeps it, and whoever
// takes the old login gets nothing.
func TestPRAuthorMatchedByID(t *testing.T) {
	t.Parallel()
	fx := newAuthFixture(t)
	app := fx.project("app", "github", "octo/app", false)
	prEval := fx.eval(app, status.EvalFailed, 12, "alice") // recorded with alice's user id
	job, _ := fx.job(app, prEval, status.JobFailed)
	rebuild := func(b *browser) (int, status.JobStatus) {
		t.Helper()
		if _, err := fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'failed' WHERE id = $1`, job); err != nil {
			t.Fatal(err)
		}
		resp, body := b.post(fmt.Sprintf("/api/builds/%d/rebuild", job), url.Values{"csrf": {b.csrf()}}, nil)
		if resp.StatusCode/100 == 5 {
			t.Errorf("rebuild: %d %s", resp.StatusCode, body)
		}
		return resp.StatusCode, fx.jobStatus(job)
	}
	if code, st := rebuild(fx.browser().login("alice")); code != http.StatusOK || st != status.JobPending {
		t.Fatalf("the author rebuilds their pull request's job: %d, job %s; want 200, pending", code, st)
	}
	fx.gh.RenameUser("alice", "alice2")
	if code, st := rebuild(fx.browser().login("alice2")); code != http.StatusOK || st != status.JobPending {
		t.Errorf("the renamed author rebuilds: %d, job %s; want 200, pending", code, st)
	}
	fx.gh.CreateUser("alice")
	if code, st := rebuild(fx.browser().login("alice")); code != http.StatusForbidden || st != status.JobFailed {
		t.Errorf("the new holder of the author's old login rebuilds: %d, job %s; want 403, failed", code, st)
	}
}

// Served over HTTPS (public_url https), the UI's cookies are __Host- prefixed, Secure, Path=/
// and without Domain; and a session cookie copied before logout is refused after it.
func TestHostCookiesAndServerSideLogout(t *testing.T) {
	t.Parallel()
	fx := newAuthFixture(t)
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	old := fx.u.cfg
	u, err := New(Config{Pool: fx.pool, Forges: old.Forges, Logger: old.Logger, Secret: old.Secret, Admins: old.Admins,
		PublicURL: srv.URL, OAuth: old.OAuth})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = testMux(u)
	fx.u, fx.srv = u, srv
	b := fx.browser()
	b.client.Transport = srv.Client().Transport

	fx.gh.OAuthAs("alice")
	resp, _ := b.get("/ci/login/github")
	st := cookieNamed(resp, "__Host-"+stateCookie)
	if st == nil || !st.Secure || st.Path != "/" || st.Domain != "" {
		t.Fatalf("state cookie %+v: want __Host-%s, Secure, Path /, no Domain", st, stateCookie)
	}
	authURL, err := resp.Location()
	if err != nil {
		t.Fatal(err)
	}
	resp, _ = b.get(authURL.String())
	callback, err := resp.Location()
	if err != nil {
		t.Fatal(err)
	}
	resp, body := b.get(callback.String())
	c := cookieNamed(resp, "__Host-harmonia_session")
	if resp.StatusCode != http.StatusSeeOther || c == nil || !c.Secure || c.Path != "/" || c.Domain != "" || !c.HttpOnly {
		t.Fatalf("callback %d, session cookie %+v: want __Host-harmonia_session, Secure, Path /, no Domain, HttpOnly\n%s", resp.StatusCode, c, body)
	}

	// The cookie, copied elsewhere, works while the session lasts...
	loggedIn := func(value string) bool {
		t.Helper()
		req, _ := http.NewRequestWithContext(fx.ctx, "GET", srv.URL+"/ci/", nil)
		req.AddCookie(&http.Cookie{Name: "__Host-harmonia_session", Value: value})
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		page, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(page), "alice@github")
	}
	if !loggedIn(c.Value) {
		t.Fatal("a copy of the fresh session cookie is not logged in")
	}
	// ...and not after the user logs out.
	resp, _ = b.post("/ci/logout", url.Values{"csrf": {b.csrf()}}, map[string]string{"Accept": "text/html"})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	if loggedIn(c.Value) {
		t.Error("the session cookie copied before logout still logs in after it")
	}
}

// The forges' permission APIs take logins. A session's login, renamed and taken by someone
// else since the session began, does not lend the newcomer's permissions to the session.
func TestStaleSessionLoginLendsNothing(t *testing.T) {
	t.Parallel()
	fx := newAuthFixture(t) // "writer" may push to octo/app
	now := time.Now()
	fx.u.auth.logins.now = func() time.Time { return now }
	app := fx.project("app", "github", "octo/app", false)
	job, _ := fx.job(app, fx.eval(app, status.EvalFailed, 0, ""), status.JobFailed)
	rebuild := func(b *browser) int {
		t.Helper()
		if _, err := fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'failed' WHERE id = $1`, job); err != nil {
			t.Fatal(err)
		}
		resp, _ := b.post(fmt.Sprintf("/api/builds/%d/rebuild", job), url.Values{"csrf": {b.csrf()}}, nil)
		return resp.StatusCode
	}
	old := fx.browser().login("writer")
	if got := rebuild(old); got != http.StatusOK {
		t.Fatalf("the writer rebuilds: %d, want 200", got)
	}
	// The writer renames their account, and someone else takes "writer" (the stand-in keeps
	// the repository's permissions by login: the newcomer has write).
	fx.gh.RenameUser("writer", "writer2")
	fx.gh.CreateUser("writer")
	now = now.Add(DefaultPermissionTTL + time.Second)
	if got := rebuild(old); got != http.StatusForbidden {
		t.Errorf("the session begun as writer, now someone else's login: %d, want 403", got)
	}
}
