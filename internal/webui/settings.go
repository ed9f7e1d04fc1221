package webui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
)

// The admins' project settings, admin only:
//
//	GET  /ci/settings/projects[?q=&after=]        the repositories the forges listed, searchable
//	GET  /ci/settings/projects/{repo_id}          a repository's project settings form
//	POST /ci/settings/projects/{repo_id}          save them (enable with them if it has no project)
//	POST /ci/settings/projects/{repo_id}/enable   enable its project, registering the webhook
//	POST /ci/settings/projects/{repo_id}/disable  disable it, removing the webhook
//
// Only the [auth] admins see or change them: a logged-out browser is sent to the login, a
// logged-in user who is not an admin gets a 403. The POSTs are CSRF-checked as the actions are
// (actions.go: the session's token in the "csrf" field, or the admin token for scripts) and
// answer a browser with a 303 back to the page and a notice; a validation error re-renders the
// form with the message and what the user typed (400), a forge's refusal shows its message.

// settingsPageSize is how many repositories the list shows before "Load more".
const settingsPageSize = 100

// Defaults of a new project's settings (the projects table's column defaults), offered in the
// form of a repository without a project.
const (
	defaultShares  = 100
	defaultPRTrust = project.PRTrustCollaborators
)

// notices are the messages a settings page shows after a redirect (?notice=…): a fixed set,
// so a link cannot put words on the page.
var notices = map[string]string{
	"saved":    "Settings saved.",
	"enabled":  "Project enabled: the forge now sends its events here.",
	"disabled": "Project disabled: its webhook is removed and its events are ignored.",
}

func (u *UI) registerSettings(rt *access.Routes) {
	rt.Handle("GET /ci/settings/projects", access.Admin, u.page(u.settingsList))
	rt.Handle("GET /ci/settings/projects/{repo_id}", access.Admin, u.page(u.settingsProject))
	rt.Handle("POST /ci/settings/projects/{repo_id}", access.Admin, u.settingsPost(u.saveSettings))
	rt.Handle("POST /ci/settings/projects/{repo_id}/enable", access.Admin, u.settingsPost(u.enableProject))
	rt.Handle("POST /ci/settings/projects/{repo_id}/disable", access.Admin, u.settingsPost(u.disableProject))
}

// errNotAdmin is the 403 of a settings page for a user who is not an admin.
var errNotAdmin = httpapi.Errorf(http.StatusForbidden, "only admins may see and change project settings")

// requireAdmin lets an [auth] admin's GET through (ok true). Otherwise it answers: a redirect
// to the login for a logged-out browser (when a forge offers login), else a 403.
func (u *UI) requireAdmin(w http.ResponseWriter, r *http.Request) (ok bool, err error) {
	if s, in := u.session(r); in {
		if u.isAdmin(r.Context(), s.Forge, s.UserID) {
			return true, nil
		}
		return false, errNotAdmin
	}
	if u.auth.sessions != nil && len(u.auth.oauth) > 0 {
		http.Redirect(w, r, "/ci/login?"+url.Values{"next": {r.URL.RequestURI()}}.Encode(), http.StatusFound)
		return false, nil
	}
	return false, httpapi.Errorf(http.StatusForbidden, "only admins may see project settings, and login is not configured on this node")
}

// RepoSettings is a repository with its project's settings, as the settings pages show it.
type RepoSettings struct {
	ID                 int64
	Forge, FullName    string
	CloneURL           string
	DefaultBranch      string
	Private            bool
	HookID             string
	Project            string // "" when it has none
	HasProject         bool
	Enabled            bool
	Shares             int
	PREnabled          bool
	PRTrust            string
	PollSeconds        int
	PromotePROutputs   bool
	URL                string // the repository's web page; "" when unknown
	ForgeNotConfigured bool   // its forge is not one of this node's [[forges]] (or it was added by URL)
	CSRF               string // the viewer's CSRF token, for the Enable and Disable forms
}

// PollInterval is the poll interval as the form writes it ("5m", "1h30m", "2d"); "" when off.
func (s RepoSettings) PollInterval() string { return formatInterval(s.PollSeconds) }

func scanRepoSettings(row pgx.CollectableRow) (RepoSettings, error) {
	var s RepoSettings
	err := row.Scan(&s.ID, &s.Forge, &s.FullName, &s.CloneURL, &s.DefaultBranch, &s.Private, &s.HookID,
		&s.Project, &s.HasProject, &s.Enabled, &s.Shares, &s.PREnabled, &s.PRTrust, &s.PollSeconds,
		&s.PromotePROutputs)
	s.CloneURL, s.FullName = project.RedactURL(s.CloneURL), project.RedactURL(s.FullName)
	return s, err
}

// decorate fills in what does not come from the database.
func (u *UI) decorate(r *http.Request, s *RepoSettings) {
	s.URL = repoURL(s.CloneURL)
	if u.auth.sessions != nil {
		s.CSRF = u.auth.sessions.RequestCSRFToken(r)
	}
	_, ok := u.cfg.Forges[s.Forge]
	s.ForgeNotConfigured = !ok
}

// SettingsList is the list page's data.
type SettingsList struct {
	Query  string
	Repos  []RepoSettings
	After  int64  // this page's cursor; 0 on the first page
	More   string // the next page's URL; "" on the last page
	Notice string
}

// likePattern is an ILIKE pattern matching s anywhere, with LIKE's wildcards in s escaped.
func likePattern(s string) string {
	if s == "" {
		return ""
	}
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return "%" + r.Replace(s) + "%"
}

// settingsList is GET /ci/settings/projects[?q=search&after=repo_id].
func (u *UI) settingsList(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	if ok, err := u.requireAdmin(w, r); !ok {
		return "", Page{}, err
	}
	q := r.URL.Query()
	d := SettingsList{Query: strings.TrimSpace(q.Get("q")), Notice: notices[q.Get("notice")]}
	if len(d.Query) > 200 {
		return "", Page{}, badRequest("the search is too long")
	}
	if s := q.Get("after"); s != "" {
		var err error
		if d.After, err = strconv.ParseInt(s, 10, 64); err != nil || d.After <= 0 {
			return "", Page{}, badRequest("after must be a repository id")
		}
	}
	rows, err := u.cfg.Pool.Query(r.Context(), sqlSettingsRepos, likePattern(d.Query), d.After, settingsPageSize+1)
	if err != nil {
		return "", Page{}, fmt.Errorf("list repositories: %w", err)
	}
	d.Repos, err = pgx.CollectRows(rows, scanRepoSettings)
	if err != nil {
		return "", Page{}, fmt.Errorf("list repositories: %w", err)
	}
	if len(d.Repos) > settingsPageSize {
		d.Repos = d.Repos[:settingsPageSize]
		next := url.Values{"after": {strconv.FormatInt(d.Repos[settingsPageSize-1].ID, 10)}}
		if d.Query != "" {
			next.Set("q", d.Query)
		}
		d.More = "/ci/settings/projects?" + next.Encode()
	}
	for i := range d.Repos {
		u.decorate(r, &d.Repos[i])
	}
	return "settings", Page{Title: "Project settings", Nav: "settings", Data: d}, nil
}

// SettingsForm is what the settings form shows: the stored settings, or what the user typed.
type SettingsForm struct {
	Name         string // a new project's name ("" = the repository's name)
	Shares       string
	PREnabled    bool
	PRTrust      string
	PollInterval string
	// PromotePROutputs: a branch's evaluation takes pull requests' (quarantined) outputs as
	// built; off, it rebuilds them.
	PromotePROutputs bool

	submitted bool // read from a POST (parseForm)
}

// SettingsProject is the settings page's data.
type SettingsProject struct {
	Repo   RepoSettings
	Form   SettingsForm
	Trusts []string // the choices of PR trust
	Notice string
	Error  string // why the last change failed
}

// loadRepoSettings reads repository id; a 404 if there is none.
func (u *UI) loadRepoSettings(r *http.Request, id int64) (RepoSettings, error) {
	rows, err := u.cfg.Pool.Query(r.Context(), sqlSettingsRepo, id)
	if err != nil {
		return RepoSettings{}, fmt.Errorf("repository %d: %w", id, err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanRepoSettings)
	if errors.Is(err, pgx.ErrNoRows) {
		return RepoSettings{}, notFound("no repository %d", id)
	}
	if err != nil {
		return RepoSettings{}, fmt.Errorf("repository %d: %w", id, err)
	}
	u.decorate(r, &s)
	return s, nil
}

// storedForm is the form filled with a repository's settings, or a new project's defaults.
func storedForm(s RepoSettings) SettingsForm {
	if !s.HasProject {
		return SettingsForm{Shares: strconv.Itoa(defaultShares), PREnabled: true, PRTrust: defaultPRTrust, PromotePROutputs: true}
	}
	return SettingsForm{Shares: strconv.Itoa(s.Shares), PREnabled: s.PREnabled, PRTrust: s.PRTrust,
		PollInterval: s.PollInterval(), PromotePROutputs: s.PromotePROutputs}
}

func settingsPage(d SettingsProject) Page {
	d.Trusts = []string{project.PRTrustCollaborators, project.PRTrustAll, project.PRTrustNone}
	return Page{Title: "Settings of " + d.Repo.FullName, Nav: "settings", Data: d}
}

// settingsRepoID is the {repo_id} of the path; a 404 if it is not an id.
func settingsRepoID(r *http.Request) (int64, error) {
	raw := r.PathValue("repo_id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 || strings.TrimLeft(raw, "0123456789") != "" {
		if len(raw) > 40 {
			raw = raw[:40] + "…"
		}
		return 0, notFound("no repository %q", raw)
	}
	return id, nil
}

// settingsProject is GET /ci/settings/projects/{repo_id}[?notice=…].
func (u *UI) settingsProject(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	if ok, err := u.requireAdmin(w, r); !ok {
		return "", Page{}, err
	}
	id, err := settingsRepoID(r)
	if err != nil {
		return "", Page{}, err
	}
	s, err := u.loadRepoSettings(r, id)
	if err != nil {
		return "", Page{}, err
	}
	return "settings_project", settingsPage(SettingsProject{Repo: s, Form: storedForm(s),
		Notice: notices[r.URL.Query().Get("notice")]}), nil
}

// settingsError is a change that failed in a way the user can fix or should read: the page is
// shown again with Msg (and the form as submitted), with status Code.
type settingsError struct {
	Code int
	Msg  string
	Err  error // logged, not shown
}

func (e *settingsError) Error() string { return e.Msg }

// postFunc carries out a settings POST on repository id; it returns the notice of the page to
// go back to, or an error (a *settingsError re-renders the form).
type postFunc func(r *http.Request, id int64, form *SettingsForm) (notice string, err error)

// settingsPost wraps a postFunc with the admin check (the session with its CSRF token, or the
// admin token) and the answer.
func (u *UI) settingsPost(run postFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		r.Body = http.MaxBytesReader(w, r.Body, maxActionBody)
		id, err := settingsRepoID(r)
		if err != nil {
			u.fail(w, r, err, "/ci/settings/projects")
			return
		}
		back := fmt.Sprintf("/ci/settings/projects/%d", id)
		who, err := u.authenticate(r)
		if err == nil && !who.admin {
			err = errNotAdmin
		}
		if err != nil {
			u.fail(w, r, err, back)
			return
		}
		var form SettingsForm
		notice, err := run(r, id, &form)
		var se *settingsError
		switch {
		case errors.As(err, &se):
			u.log.Info("project settings refused", "path", r.URL.Path, "by", who.String(), "status", se.Code,
				"message", se.Msg, "error", se.Err)
			s, lerr := u.loadRepoSettings(r, id)
			if lerr != nil {
				u.fail(w, r, lerr, back)
				return
			}
			if !form.submitted {
				form = storedForm(s) // enable and disable carry no form: show the stored one
			}
			if !browserForm(r) && r.Header.Get("HX-Request") != "true" {
				httpapi.WriteJSON(w, se.Code, map[string]string{"error": se.Msg})
				return
			}
			p := settingsPage(SettingsProject{Repo: s, Form: form, Error: se.Msg})
			p.Scripts, p.Viewer = u.scripts, u.viewer(r)
			u.render(w, se.Code, "settings_project", p)
			return
		case err != nil:
			u.fail(w, r, err, back)
			return
		}
		u.log.Info("project settings", "path", r.URL.Path, "by", who.String(), "notice", notice)
		action := lastSegment(r.URL.Path)
		if action != "enable" && action != "disable" {
			action = "settings"
		}
		u.record(ctx, "repo", action, id, who, notices[notice])
		if !browserForm(r) && r.Header.Get("HX-Request") != "true" {
			httpapi.WriteJSON(w, http.StatusOK, map[string]any{"message": notices[notice], "repo_id": id})
			return
		}
		to := back
		if strings.HasSuffix(r.URL.Path, "/enable") || strings.HasSuffix(r.URL.Path, "/disable") {
			to = u.returnTo(r, back) // the list or the settings page, whichever the button was on
		}
		http.Redirect(w, r, withNotice(to, notice), http.StatusSeeOther)
	})
}

// withNotice adds ?notice=n to a local URL (replacing an earlier one).
func withNotice(to, notice string) string {
	p, err := url.Parse(to)
	if err != nil {
		return to
	}
	q := p.Query()
	q.Set("notice", notice)
	q.Del("after") // the changed row is on the first page
	p.RawQuery = q.Encode()
	return p.String()
}

// parseForm reads the settings form into form (as typed) and returns the settings, or a 400
// saying what is wrong.
func parseForm(r *http.Request, form *SettingsForm) (project.Settings, error) {
	if err := r.ParseForm(); err != nil {
		return project.Settings{}, &settingsError{Code: http.StatusBadRequest, Msg: "the form could not be read", Err: err}
	}
	*form = SettingsForm{
		Name:             strings.TrimSpace(r.PostFormValue("name")),
		Shares:           strings.TrimSpace(r.PostFormValue("shares")),
		PREnabled:        r.PostFormValue("pr_enabled") != "",
		PRTrust:          r.PostFormValue("pr_trust"),
		PollInterval:     strings.TrimSpace(r.PostFormValue("poll_interval")),
		PromotePROutputs: r.PostFormValue("promote_pr_outputs") != "off",
		submitted:        true,
	}
	invalid := func(format string, args ...any) error {
		return &settingsError{Code: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...)}
	}
	shares, err := strconv.Atoi(form.Shares)
	if err != nil {
		return project.Settings{}, invalid("shares must be a whole number from 1 to 1000000, not %q", form.Shares)
	}
	var poll time.Duration
	if form.PollInterval != "" {
		var d config.Duration
		if err := d.UnmarshalText([]byte(form.PollInterval)); err != nil {
			return project.Settings{}, invalid("poll interval %q: want a duration such as 5m, 1h or 1d; empty or 0s turns polling off", form.PollInterval)
		}
		poll = d.Duration
	}
	trust, pr := form.PRTrust, form.PREnabled
	s := project.Settings{Shares: &shares, PREnabled: &pr, PRTrust: &trust, PollInterval: &poll}
	// A form without the field (a script written before it) leaves the setting as it is.
	switch r.PostFormValue("promote_pr_outputs") {
	case "":
	case "on", "off":
		promote := form.PromotePROutputs
		s.PromotePROutputs = &promote
	default:
		return project.Settings{}, invalid("promote_pr_outputs %q: want on or off", r.PostFormValue("promote_pr_outputs"))
	}
	if err := s.Validate(); err != nil {
		return project.Settings{}, invalid("%v", err)
	}
	if form.Name != "" {
		if err := project.ValidateName(form.Name); err != nil {
			return project.Settings{}, invalid("%v", err)
		}
	}
	return s, nil
}

// saveSettings is POST /ci/settings/projects/{repo_id}: the form's settings stored, or, for a
// repository without a project, its project enabled with them.
func (u *UI) saveSettings(r *http.Request, id int64, form *SettingsForm) (string, error) {
	s, err := parseForm(r, form)
	if err != nil {
		return "", err
	}
	repo, err := u.loadRepoSettings(r, id)
	if err != nil {
		return "", err
	}
	if !repo.HasProject {
		if _, err := u.enabler(r).Enable(r.Context(), id, project.EnableParams{Name: form.Name, Settings: s}); err != nil {
			return "", settingsProjectError(err)
		}
		return "enabled", nil
	}
	if form.Name != "" && form.Name != repo.Project {
		return "", &settingsError{Code: http.StatusBadRequest, Msg: "a project's name cannot be changed"}
	}
	if _, err := project.Configure(r.Context(), u.cfg.Pool, id, s); err != nil {
		return "", settingsProjectError(err)
	}
	// A project added by URL is private if the admin says so (a forge's, as its forge says).
	if repo.Forge == forgeGit {
		if err := project.SetPrivate(r.Context(), u.cfg.Pool, id, r.PostFormValue("private") == "on"); err != nil {
			return "", settingsProjectError(err)
		}
	}
	return "saved", nil
}

// enableProject is POST /ci/settings/projects/{repo_id}/enable: the project created (with the
// defaults) or enabled again, and the repository's webhook registered. A project added by URL
// has no forge and no webhook: it is just switched on.
func (u *UI) enableProject(r *http.Request, id int64, _ *SettingsForm) (string, error) {
	repo, err := u.loadRepoSettings(r, id)
	if err != nil {
		return "", err
	}
	if repo.Forge == forgeGit && repo.HasProject {
		on := true
		if _, err := project.Set(r.Context(), u.cfg.Pool, repo.Project, project.SetParams{Enabled: &on}); err != nil {
			return "", settingsProjectError(err)
		}
		return "enabled", nil
	}
	if _, err := u.enabler(r).Enable(r.Context(), id, project.EnableParams{}); err != nil {
		return "", settingsProjectError(err)
	}
	return "enabled", nil
}

// disableProject is POST /ci/settings/projects/{repo_id}/disable.
func (u *UI) disableProject(r *http.Request, id int64, _ *SettingsForm) (string, error) {
	if _, err := u.enabler(r).Disable(r.Context(), id); err != nil {
		return "", settingsProjectError(err)
	}
	return "disabled", nil
}

// enabler is the project.Enabler of this node: webhooks are delivered under the public URL, or
// under the address the admin's request came to when none is configured.
func (u *UI) enabler(r *http.Request) project.Enabler {
	return project.Enabler{Pool: u.cfg.Pool, Forges: u.cfg.Forges, PublicURL: u.publicBase(r)}
}

// publicBase is where users (and forges) reach this node: the configured public URL, else the
// scheme and Host of the request (as callbackURL derives the OAuth callback).
func (u *UI) publicBase(r *http.Request) string {
	if base := strings.TrimRight(u.cfg.PublicURL, "/"); base != "" {
		return base
	}
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// settingsProjectError maps the project package's errors to what the settings page says, as
// the admin API does (internal/web/projects.go): the user's mistakes and the forge's refusals
// are messages on the page; anything else is an internal error.
func settingsProjectError(err error) error {
	var ae *forge.APIError
	var ue *url.Error // the forge's HTTP client failed
	switch {
	case errors.Is(err, project.ErrNoRepository):
		return notFound("%v", err)
	case errors.Is(err, project.ErrNotFound):
		return &settingsError{Code: http.StatusConflict, Msg: "this repository has no project: enable it first", Err: err}
	case errors.Is(err, project.ErrExists):
		return &settingsError{Code: http.StatusConflict, Msg: "that project name is taken: choose another", Err: err}
	case errors.Is(err, project.ErrForgeNotConfigured):
		return &settingsError{Code: http.StatusConflict, Msg: "this repository's forge is not configured on this node ([[forges]])", Err: err}
	case errors.Is(err, forge.ErrNotFound):
		return &settingsError{Code: http.StatusBadGateway, Msg: "the forge does not know the repository", Err: err}
	case errors.As(err, &ae):
		return &settingsError{Code: http.StatusBadGateway, Msg: fmt.Sprintf("the forge refused: %d %s", ae.Code, ae.Message), Err: err}
	case errors.As(err, &ue) && !db.Unavailable(err):
		return &settingsError{Code: http.StatusBadGateway, Msg: "the forge could not be reached; try again", Err: err}
	case errors.Is(err, context.DeadlineExceeded):
		return &settingsError{Code: http.StatusGatewayTimeout, Msg: "the forge or the database did not answer in time; try again", Err: err}
	}
	return err
}

// formatInterval writes seconds as the form's duration: "" for 0, else "2d", "1h30m", "5m",
// "90s".
func formatInterval(seconds int) string {
	if seconds <= 0 {
		return ""
	}
	d := time.Duration(seconds) * time.Second
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
