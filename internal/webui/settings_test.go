package webui

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/forge"
)

// hookForge is a forge "fake" that records webhook registrations; the Forge methods the
// settings pages do not use panic (nil embedded interface).
type hookForge struct {
	forge.Forge
	mu          sync.Mutex
	registerErr error
	registered  []string // "owner/name url"
	deleted     []string // "owner/name hookID"
}

func (f *hookForge) Name() string { return "fake" }
func (f *hookForge) Type() string { return forge.TypeGitea }
func (f *hookForge) CommitURL(forge.Repo, string) string {
	return ""
}

func (f *hookForge) RegisterWebhook(_ context.Context, repo forge.Repo, url string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.registerErr != nil {
		return "", f.registerErr
	}
	f.registered = append(f.registered, repo.FullName()+" "+url)
	return "hook-" + repo.Name, nil
}

func (f *hookForge) DeleteWebhook(_ context.Context, repo forge.Repo, hookID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, repo.FullName()+" "+hookID)
	return nil
}

func (f *hookForge) calls() (registered, deleted []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.registered), slices.Clone(f.deleted)
}

// settingsFixture is the auth fixture (admin github:boss) with the forge "fake" added, its
// repositories octo/app (with the project "app"), octo/lib and other/tool (without), and
// the browsers of boss and of reader (not an admin).
type settingsFixture struct {
	*authFixture
	fake           *hookForge
	app, lib, tool int64 // repository ids
	boss, reader   *browser
}

func newSettingsFixture(t *testing.T) *settingsFixture {
	t.Helper()
	fx := &settingsFixture{authFixture: newAuthFixture(t), fake: &hookForge{}}
	fx.u.cfg.Forges["fake"] = fx.fake
	fx.app = fx.repo("octo/app")
	fx.id(`INSERT INTO projects (repo_id, name) VALUES ($1, 'app') RETURNING id`, fx.app)
	fx.lib = fx.repo("octo/lib")
	fx.tool = fx.repo("other/tool")
	fx.boss = fx.browser().login("boss")
	fx.reader = fx.browser().login("reader")
	return fx
}

// repo inserts a repository of the forge "fake".
func (fx *settingsFixture) repo(fullName string) int64 {
	fx.t.Helper()
	owner, name, _ := strings.Cut(fullName, "/")
	return fx.id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url) VALUES ('fake', $1, $2, $3, $4)
RETURNING id`, owner, name, fullName, "https://fake.test/"+fullName+".git")
}

// asPage is the header of a browser's form post.
var asPage = map[string]string{"Accept": "text/html"}

// settingsCSRF is the CSRF token of a page b sees.
func (b *browser) settingsCSRF(path string) string {
	b.fx.t.Helper()
	_, body := b.get(path)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		b.fx.t.Fatalf("no CSRF field on %s:\n%s", path, body)
	}
	return m[1]
}

func TestSettingsAccess(t *testing.T) {
	t.Parallel()
	fx := newSettingsFixture(t)
	list, one := "/ci/settings/projects", fmt.Sprintf("/ci/settings/projects/%d", fx.lib)

	// Logged out: to the login, coming back.
	for _, p := range []string{list, one, list + "?q=octo"} {
		resp, _ := fx.browser().get(p)
		want := "/ci/login?" + url.Values{"next": {p}}.Encode()
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != want {
			t.Errorf("logged-out GET %s: %d to %q, want 302 to %q", p, resp.StatusCode, resp.Header.Get("Location"), want)
		}
	}
	// Not an admin: 403, and nothing of the repositories.
	for _, p := range []string{list, one} {
		resp, body := fx.reader.get(p)
		if resp.StatusCode != http.StatusForbidden || strings.Contains(body, "octo/lib") {
			t.Errorf("reader GET %s: %d, want 403 without the repositories:\n%s", p, resp.StatusCode, body)
		}
	}
	// The admin.
	resp, body := fx.boss.get(list)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "octo/lib") {
		t.Fatalf("boss GET %s: %d:\n%s", list, resp.StatusCode, body)
	}
	if resp, _ := fx.boss.get("/ci/settings/projects/999999"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("settings of no repository: %d, want 404", resp.StatusCode)
	}
	if resp, _ := fx.boss.get("/ci/settings/projects/x1"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("settings of a malformed id: %d, want 404", resp.StatusCode)
	}

	// The navigation's Settings link shows for admins only.
	link := `href="/ci/settings/projects"`
	if _, body := fx.boss.get("/ci/nodes"); !strings.Contains(body, link) {
		t.Error("an admin's header has no Settings link")
	}
	if _, body := fx.reader.get("/ci/nodes"); strings.Contains(body, link) {
		t.Error("a non-admin's header has the Settings link")
	}
	if _, body := fx.browser().get("/ci/nodes"); strings.Contains(body, link) {
		t.Error("a logged-out header has the Settings link")
	}

	// The POSTs: a non-admin with a good CSRF token gets 403, a logged-out browser the login.
	form := url.Values{"csrf": {fx.reader.settingsCSRF("/ci/nodes")}, "shares": {"5"}, "pr_trust": {"all"}}
	for _, p := range []string{one, one + "/enable", fmt.Sprintf("/ci/settings/projects/%d/disable", fx.app)} {
		if resp, _ := fx.reader.post(p, form, asPage); resp.StatusCode != http.StatusForbidden {
			t.Errorf("reader POST %s: %d, want 403", p, resp.StatusCode)
		}
		resp, _ := fx.browser().post(p, url.Values{"shares": {"5"}}, asPage)
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ci/login?") {
			t.Errorf("logged-out POST %s: %d to %q, want 303 to the login", p, resp.StatusCode, loc)
		}
		if resp, _ := fx.browser().post(p, nil, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("logged-out JSON POST %s: %d, want 401", p, resp.StatusCode)
		}
	}
	if n := fx.id(`SELECT count(*) FROM projects`); n != 1 {
		t.Errorf("%d projects after refused POSTs, want 1", n)
	}
	if en := fx.str(`SELECT enabled::text FROM projects WHERE name = 'app'`); en != "true" {
		t.Errorf("refused disable: app enabled = %s", en)
	}
	if reg, del := fx.fake.calls(); len(reg)+len(del) != 0 {
		t.Errorf("refused POSTs reached the forge: %q %q", reg, del)
	}

	// Without login configured: 403 (nobody could log in as an admin).
	u, _ := newTestUI(t)
	if code, _ := get(t, testMux(u), list); code != http.StatusForbidden {
		t.Errorf("GET %s without login: %d, want 403", list, code)
	}
}

var repoRowRE = regexp.MustCompile(`<tr id="repo-(\d+)">`)

// listed is the repository ids in a list page's rows.
func listed(body string) []string {
	var ids []string
	for _, m := range repoRowRE.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

func TestSettingsListSearch(t *testing.T) {
	t.Parallel()
	fx := newSettingsFixture(t)
	gh := fx.id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url) VALUES
('github', 'someone', 'thing', 'someone/thing', 'https://github.test/someone/thing.git') RETURNING id`)
	ids := func(xs ...int64) []string {
		var s []string
		for _, x := range xs {
			s = append(s, fmt.Sprint(x))
		}
		return s
	}

	_, body := fx.boss.get("/ci/settings/projects")
	if got, want := listed(body), ids(fx.app, fx.lib, fx.tool, gh); !slices.Equal(got, want) {
		t.Errorf("all repositories: %v, want %v (by forge and name)", got, want)
	}
	// The row of a project: linked, enabled, with a Disable button; one without: Enable.
	for _, want := range []string{
		`href="/ci/settings/projects/` + fmt.Sprint(fx.lib) + `"`,
		`href="/ci/app/"`,
		`action="/ci/settings/projects/` + fmt.Sprint(fx.app) + `/disable"`,
		`action="/ci/settings/projects/` + fmt.Sprint(fx.lib) + `/enable"`,
		`<span class="badge ok">enabled</span>`,
		// The search box: a plain GET form, enhanced with a debounced hx-get swapping the table.
		`<form class="settings-search" method="get" action="/ci/settings/projects"`,
		`hx-get="/ci/settings/projects" hx-trigger="keyup changed delay:300ms, search" hx-target="#repos" hx-select="#repos"`,
		`<div id="repos">`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("list page without %s:\n%s", want, body)
		}
	}

	for q, want := range map[string][]string{
		"octo":     ids(fx.app, fx.lib), // owner
		"LIB":      ids(fx.lib),         // name, any case
		"fak":      ids(fx.app, fx.lib, fx.tool),
		"github":   ids(gh), // forge
		"app":      ids(fx.app),
		"er/to":    ids(fx.tool),
		"%":        nil, // LIKE's wildcards are literal
		"_":        nil,
		"nonesuch": nil,
	} {
		resp, body := fx.boss.get("/ci/settings/projects?" + url.Values{"q": {q}}.Encode())
		if got := listed(body); resp.StatusCode != http.StatusOK || !slices.Equal(got, want) {
			t.Errorf("search %q: %d %v, want %v", q, resp.StatusCode, got, want)
		}
		if !strings.Contains(body, `value="`+q+`"`) && q != "%" {
			t.Errorf("search %q: the box does not keep it", q)
		}
	}

	// More than a page: "Load more" continues after the last row (keyset), keeping the search.
	if _, err := fx.pool.Exec(fx.ctx, `INSERT INTO repositories (forge, owner, name, full_name, clone_url)
SELECT 'fake', 'many', 'r' || lpad(i::text, 3, '0'), 'many/r' || lpad(i::text, 3, '0'), 'https://fake.test/x'
FROM generate_series(1, $1) i`, settingsPageSize+5); err != nil {
		t.Fatal(err)
	}
	_, body = fx.boss.get("/ci/settings/projects?q=many")
	first := listed(body)
	m := regexp.MustCompile(`<a class="more" href="([^"]+)"`).FindStringSubmatch(body)
	if len(first) != settingsPageSize || m == nil {
		t.Fatalf("first page of many: %d rows, more link %v", len(first), m)
	}
	next := strings.ReplaceAll(m[1], "&amp;", "&")
	if !strings.Contains(next, "q=many") || !strings.Contains(next, "after="+first[len(first)-1]) {
		t.Errorf("more link %q", next)
	}
	_, body = fx.boss.get(next)
	if second := listed(body); len(second) != 5 || slices.Contains(first, second[0]) || strings.Contains(body, `class="more"`) {
		t.Errorf("second page: %v, more link %v", second, strings.Contains(body, `class="more"`))
	}
	if resp, _ := fx.boss.get("/ci/settings/projects?after=x"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("after=x: %d, want 400", resp.StatusCode)
	}
}

func TestSettingsSave(t *testing.T) {
	t.Parallel()
	fx := newSettingsFixture(t)
	page := fmt.Sprintf("/ci/settings/projects/%d", fx.app)
	settings := func() string {
		return fx.str(`SELECT format('%s %s %s %s %s', scheduling_shares, pr_enabled::text, pr_trust, poll_interval, promote_pr_outputs::text)
FROM projects WHERE repo_id = $1`, fx.app)
	}
	before := settings()
	if before != "100 true collaborators 0 true" {
		t.Fatalf("fixture settings %q", before)
	}

	// The form shows the stored settings.
	_, body := fx.boss.get(page)
	for _, want := range []string{`action="` + page + `"`, `name="shares" value="100"`, `name="pr_enabled" value="on" checked`,
		`<option value="collaborators" selected>`, `name="poll_interval" value=""`, `<option value="on" selected>promote when a branch needs them`} {
		if !strings.Contains(body, want) {
			t.Errorf("settings form without %s:\n%s", want, body)
		}
	}

	form := url.Values{"shares": {"7"}, "pr_trust": {"all"}, "poll_interval": {"5m"}, "promote_pr_outputs": {"off"}} // pr_enabled unchecked
	// Without the CSRF token, or with another session's: 403, nothing changes.
	if resp, _ := fx.boss.post(page, form, asPage); resp.StatusCode != http.StatusForbidden {
		t.Errorf("save without CSRF: %d, want 403", resp.StatusCode)
	}
	form.Set("csrf", fx.reader.settingsCSRF("/ci/nodes"))
	if resp, _ := fx.boss.post(page, form, asPage); resp.StatusCode != http.StatusForbidden {
		t.Errorf("save with another session's CSRF token: %d, want 403", resp.StatusCode)
	}
	if got := settings(); got != before {
		t.Errorf("refused saves changed the settings to %q", got)
	}

	form.Set("csrf", fx.boss.settingsCSRF(page))
	resp, body := fx.boss.post(page, form, asPage)
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != page+"?notice=saved" {
		t.Fatalf("save: %d to %q:\n%s", resp.StatusCode, loc, body)
	}
	if got := settings(); got != "7 false all 300 false" {
		t.Errorf("saved settings %q, want 7 false all 300 false", got)
	}
	_, body = fx.boss.get(page + "?notice=saved")
	for _, want := range []string{"Settings saved.", `name="shares" value="7"`, `name="poll_interval" value="5m"`,
		`<option value="all" selected>`, `<option value="off" selected>rebuild when a branch needs them`} {
		if !strings.Contains(body, want) {
			t.Errorf("page after saving without %s", want)
		}
	}
	if strings.Contains(body, `value="on" checked`) {
		t.Error("PR builds still checked after unchecking them")
	}

	// Invalid input: 400, the message, and the form as the user typed it; nothing changes.
	for _, c := range []struct{ field, value, msg string }{
		{"poll_interval", "5 minutes", "poll interval &#34;5 minutes&#34;"},
		{"poll_interval", "30s", "whole seconds from 1m to 7d"},
		{"poll_interval", "-1h", "whole seconds from 1m to 7d"},
		{"shares", "lots", "shares must be a whole number"},
		{"shares", "0", "shares must be between 1 and 1000000"},
		{"pr_trust", "everyone", "want collaborators, all or none"},
	} {
		bad := url.Values{"csrf": {form.Get("csrf")}, "shares": {"42"}, "pr_enabled": {"on"}, "pr_trust": {"none"},
			"poll_interval": {"2h"}}
		bad.Set(c.field, c.value)
		resp, body := fx.boss.post(page, bad, asPage)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, c.msg) {
			t.Errorf("%s=%q: %d, want 400 with %q:\n%s", c.field, c.value, resp.StatusCode, c.msg, body)
			continue
		}
		kept := []string{`name="pr_enabled" value="on" checked`}
		if c.field != "pr_trust" { // a select: a value that is no choice cannot be shown
			kept = append(kept, `name="`+c.field+`" value="`+c.value+`"`)
		}
		if c.field != "shares" {
			kept = append(kept, `name="shares" value="42"`)
		}
		if c.field != "poll_interval" {
			kept = append(kept, `name="poll_interval" value="2h"`)
		}
		if c.field != "pr_trust" {
			kept = append(kept, `<option value="none" selected>`)
		}
		for _, k := range kept {
			if !strings.Contains(body, k) {
				t.Errorf("%s=%q: the re-rendered form lost %s", c.field, c.value, k)
			}
		}
	}
	if got := settings(); got != "7 false all 300 false" {
		t.Errorf("invalid saves changed the settings to %q", got)
	}

	// Empty or 0s turns polling off.
	for _, off := range []string{"", "0s"} {
		form.Set("poll_interval", off)
		if resp, _ := fx.boss.post(page, form, asPage); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("poll interval %q: %d", off, resp.StatusCode)
		}
		if got := settings(); got != "7 false all 0 false" {
			t.Errorf("poll interval %q: settings %q", off, got)
		}
		form.Set("poll_interval", "1d")
		fx.boss.post(page, form, asPage)
		if got := settings(); got != "7 false all 86400 false" {
			t.Errorf("poll interval 1d: settings %q", got)
		}
	}
	_, body = fx.boss.get(page)
	if !strings.Contains(body, `name="poll_interval" value="1d"`) {
		t.Error("a day's poll interval is not shown as 1d")
	}

	// The admin token works for scripts (no CSRF token), answered in JSON.
	req := url.Values{"shares": {"9"}, "pr_enabled": {"on"}, "pr_trust": {"none"}}
	resp, body = fx.browser().post(page, req, map[string]string{"Authorization": "Bearer " + authTestToken})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Settings saved.") {
		t.Errorf("save with the admin token: %d %s", resp.StatusCode, body)
	}
	// A form without promote_pr_outputs (a script written before it) leaves it as it was.
	if got := settings(); got != "9 true none 0 false" {
		t.Errorf("after the admin token's save: %q", got)
	}
}

func TestSettingsEnableDisable(t *testing.T) {
	t.Parallel()
	fx := newSettingsFixture(t)
	list := "/ci/settings/projects?q=octo"
	csrf := fx.boss.settingsCSRF(list)
	hook := fx.srv.URL + "/webhook/fake"
	state := func(repo int64) string {
		return fx.str(`SELECT format('%s %s %s', COALESCE(p.name, '-'), COALESCE(p.enabled::text, '-'), COALESCE(r.hook_id, '-'))
FROM repositories r LEFT JOIN projects p ON p.repo_id = r.id WHERE r.id = $1`, repo)
	}

	// Enable from the list: the hook registered at this node's address, the project created,
	// and back to the list with a notice.
	enable := fmt.Sprintf("/ci/settings/projects/%d/enable", fx.lib)
	resp, body := fx.boss.post(enable, url.Values{"csrf": {csrf}},
		map[string]string{"Accept": "text/html", "Referer": fx.srv.URL + list})
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/ci/settings/projects?notice=enabled&q=octo" {
		t.Fatalf("enable: %d to %q:\n%s", resp.StatusCode, loc, body)
	}
	if got := state(fx.lib); got != "lib true hook-lib" {
		t.Errorf("after enable: %q, want lib true hook-lib", got)
	}
	if got := fx.str(`SELECT actor || ' ' || action FROM action_log WHERE repo_id = $1`, fx.lib); got != "github:boss enable" {
		t.Errorf("the enable recorded as %q, want github:boss enable", got)
	}
	if reg, _ := fx.fake.calls(); !slices.Equal(reg, []string{"octo/lib " + hook}) {
		t.Errorf("registered hooks %q, want octo/lib at %s", reg, hook)
	}
	_, body = fx.boss.get("/ci/settings/projects?notice=enabled&q=octo")
	if !strings.Contains(body, "Project enabled") || !strings.Contains(body, `action="`+fmt.Sprintf("/ci/settings/projects/%d/disable", fx.lib)) {
		t.Errorf("list after enable:\n%s", body)
	}

	// Disable from the settings page: the hook deleted, the project kept but disabled.
	disable := fmt.Sprintf("/ci/settings/projects/%d/disable", fx.lib)
	page := fmt.Sprintf("/ci/settings/projects/%d", fx.lib)
	resp, _ = fx.boss.post(disable, url.Values{"csrf": {csrf}}, map[string]string{"Accept": "text/html", "Referer": fx.srv.URL + page})
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != page+"?notice=disabled" {
		t.Errorf("disable: %d to %q", resp.StatusCode, loc)
	}
	if got := state(fx.lib); got != "lib false -" {
		t.Errorf("after disable: %q, want lib false -", got)
	}
	if _, del := fx.fake.calls(); !slices.Equal(del, []string{"octo/lib hook-lib"}) {
		t.Errorf("deleted hooks %q", del)
	}
	// Disabling a repository without a project says so.
	resp, body = fx.boss.post(fmt.Sprintf("/ci/settings/projects/%d/disable", fx.tool), url.Values{"csrf": {csrf}}, asPage)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "has no project") {
		t.Errorf("disable without a project: %d:\n%s", resp.StatusCode, body)
	}

	// The forge refuses: its message on the page (502, not a 500), and no project.
	fx.fake.mu.Lock()
	fx.fake.registerErr = fmt.Errorf("register: %w", &forge.APIError{Method: "POST", URL: "https://fake.test/hooks", Code: 403, Message: "token lacks write:repo_hook"})
	fx.fake.mu.Unlock()
	resp, body = fx.boss.post(fmt.Sprintf("/ci/settings/projects/%d/enable", fx.tool), url.Values{"csrf": {csrf}}, asPage)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "the forge refused: 403 token lacks write:repo_hook") ||
		!strings.Contains(body, "other/tool") {
		t.Errorf("enable refused by the forge: %d:\n%s", resp.StatusCode, body)
	}
	if got := state(fx.tool); got != "- - -" {
		t.Errorf("after a refused enable: %q", got)
	}
	// Saving the form of a repository without a project enables it with those settings; a
	// forge error keeps what the admin typed.
	toolPage := fmt.Sprintf("/ci/settings/projects/%d", fx.tool)
	form := url.Values{"csrf": {csrf}, "name": {"the-tool"}, "shares": {"3"}, "pr_trust": {"none"}, "poll_interval": {"10m"}}
	resp, body = fx.boss.post(toolPage, form, asPage)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, `name="name" value="the-tool"`) ||
		!strings.Contains(body, `name="poll_interval" value="10m"`) {
		t.Errorf("save-to-enable refused by the forge: %d:\n%s", resp.StatusCode, body)
	}
	fx.fake.mu.Lock()
	fx.fake.registerErr = nil
	fx.fake.mu.Unlock()
	resp, _ = fx.boss.post(toolPage, form, asPage)
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != toolPage+"?notice=enabled" {
		t.Errorf("save-to-enable: %d to %q", resp.StatusCode, loc)
	}
	if got := state(fx.tool); got != "the-tool true hook-tool" {
		t.Errorf("after save-to-enable: %q", got)
	}
	if got := fx.str(`SELECT format('%s %s %s %s', scheduling_shares, pr_enabled::text, pr_trust, poll_interval) FROM projects WHERE name = 'the-tool'`); got != "3 false none 600" {
		t.Errorf("save-to-enable settings %q", got)
	}
	// A taken name is the admin's to fix.
	other := fx.repo("octo/other")
	form.Set("name", "app")
	resp, body = fx.boss.post(fmt.Sprintf("/ci/settings/projects/%d", other), form, asPage)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "name is taken") {
		t.Errorf("enable with a taken name: %d:\n%s", resp.StatusCode, body)
	}

	// A repository of a forge this node does not have: no Enable button, and a message.
	gone := fx.id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url) VALUES
('elsewhere', 'a', 'b', 'a/b', 'https://elsewhere.test/a/b.git') RETURNING id`)
	_, body = fx.boss.get(fmt.Sprintf("/ci/settings/projects/%d", gone))
	if strings.Contains(body, "/enable") || !strings.Contains(body, "no configured forge") {
		t.Errorf("settings of a repository of an unknown forge:\n%s", body)
	}
	resp, body = fx.boss.post(fmt.Sprintf("/ci/settings/projects/%d/enable", gone), url.Values{"csrf": {csrf}}, asPage)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "not configured on this node") {
		t.Errorf("enable on an unknown forge: %d:\n%s", resp.StatusCode, body)
	}
}

func TestSettingsEscaping(t *testing.T) {
	t.Parallel()
	fx := newSettingsFixture(t)
	hostile := `<script>alert(1)</script>/"><img src=x onerror=alert(2)>`
	owner, name, _ := strings.Cut(hostile, "/")
	id := fx.id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url, default_branch)
VALUES ('fake', $1, $2, $3, 'javascript:alert(3)', '<b>main</b>') RETURNING id`, owner, name, hostile)
	fx.id(`INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`, id, `x"><script>alert(4)</script>`)

	for _, p := range []string{
		"/ci/settings/projects",
		"/ci/settings/projects?q=" + url.QueryEscape(`"><script>alert(5)</script>`),
		"/ci/settings/projects?q=" + url.QueryEscape("script"),
		fmt.Sprintf("/ci/settings/projects/%d", id),
	} {
		resp, body := fx.boss.get(p)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", p, resp.StatusCode)
		}
		for _, bad := range []string{"<script>alert", "<img src=x", "<b>main", `href="javascript:`} {
			if strings.Contains(body, bad) {
				t.Errorf("GET %s: unescaped %q in:\n%s", p, bad, body)
			}
		}
	}
	_, body := fx.boss.get("/ci/settings/projects?q=script")
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") || len(listed(body)) != 1 {
		t.Errorf("the hostile repository is not listed, escaped:\n%s", body)
	}
	// Its settings still save (the name is only data).
	page := fmt.Sprintf("/ci/settings/projects/%d", id)
	form := url.Values{"csrf": {fx.boss.settingsCSRF(page)}, "shares": {"2"}, "pr_trust": {"all"}}
	if resp, _ := fx.boss.post(page, form, asPage); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("save the hostile repository's settings: %d", resp.StatusCode)
	}
}

// An admin marks a project added by URL private on its settings page (the checkbox is only
// there for those): from then on it is the 404 of an unknown project to everyone else.
func TestSettingsPrivateByURL(t *testing.T) {
	t.Parallel()
	fx := newSettingsFixture(t)
	fx.project("quiet", "git", "https://git.example/quiet.git", false)
	repo := fx.id(`SELECT repo_id FROM projects WHERE name = 'quiet'`)
	page := fmt.Sprintf("/ci/settings/projects/%d", repo)
	if _, body := fx.boss.get(page); !strings.Contains(body, `name="private" value="on">`) {
		t.Fatalf("no private checkbox on the settings of a project added by URL:\n%s", body)
	}
	if _, body := fx.boss.get(fmt.Sprintf("/ci/settings/projects/%d", fx.app)); strings.Contains(body, `name="private"`) {
		t.Errorf("a forge repository's settings offer the private checkbox")
	}
	save := func(private bool) {
		t.Helper()
		form := url.Values{"shares": {"100"}, "pr_trust": {"collaborators"}, "csrf": {fx.boss.settingsCSRF(page)}}
		if private {
			form.Set("private", "on")
		}
		if resp, body := fx.boss.post(page, form, asPage); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("save private=%v: %d\n%s", private, resp.StatusCode, body)
		}
	}
	save(true)
	if code, _ := get(t, fx.srv.Config.Handler, "/ci/quiet/"); code != http.StatusNotFound {
		t.Errorf("a private project added by URL, logged out: %d, want 404", code)
	}
	if resp, _ := fx.boss.get("/ci/quiet/"); resp.StatusCode != http.StatusOK {
		t.Errorf("a private project added by URL, as an admin: %d, want 200", resp.StatusCode)
	}
	save(false)
	if code, _ := get(t, fx.srv.Config.Handler, "/ci/quiet/"); code != http.StatusOK {
		t.Errorf("made public again, logged out: %d, want 200", code)
	}
}
