package webui

import (
	"cmp"
	"context"
	"crypto/subtle"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/session"
)

// Login with the forge: GET /ci/login (choose a forge), GET /ci/login/{forge} (off to the
// forge with a random state in a short-lived signed cookie), GET /ci/oauth/{forge}/callback
// (check the state, trade the code for a token, read the user's id and login, record the
// session and set its cookie, go back where the user came from), POST /ci/logout (the session
// deleted: its cookie, wherever copied, is refused from then on). Without [auth] secret_file
// there is no login, and only the admin token can act. Where the UI is served over HTTPS
// (frontend.public_url https) every cookie is __Host- prefixed, Secure and Path=/.

const (
	// stateCookie holds the OAuth state while the user is at the forge.
	stateCookie  = "harmonia_oauth"
	statePurpose = "oauth-state"
	stateTTL     = 10 * time.Minute
)

// auth is the UI's login state: the sessions, the forges users log in with, the [auth] admins
// and the permission cache.
type auth struct {
	sessions *session.Manager // nil: no login
	oauth    map[string]forge.OAuth
	perms    *permCache
	admins   *admins
	logins   *logins // which user has a login now, for the forges' permission APIs
	admin    httpapi.TokenHash
	hasAdmin bool
}

// initAuth sets up u.auth from the Config.
func (u *UI) initAuth() error {
	a := &auth{oauth: map[string]forge.OAuth{}, perms: newPermCache(u.cfg.PermissionTTL),
		admins: newAdmins(u.cfg.Pool, u.cfg.Forges, u.cfg.Admins, cmp.Or(u.cfg.PermissionTTL, DefaultPermissionTTL), u.log),
		logins: newLogins(cmp.Or(u.cfg.PermissionTTL, DefaultPermissionTTL))}
	if len(u.cfg.Secret) > 0 {
		var trusted []string
		https := false
		if pu, err := url.Parse(u.cfg.PublicURL); err == nil && pu.Host != "" {
			trusted = append(trusted, pu.Scheme+"://"+pu.Host)
			https = pu.Scheme == "https"
		}
		m, err := session.New(session.Config{Secret: u.cfg.Secret, DB: u.cfg.Pool, TrustedOrigins: trusted, HTTPS: https})
		if err != nil {
			return fmt.Errorf("web UI login: %w", err)
		}
		a.sessions = m
		for name, o := range u.cfg.OAuth {
			a.oauth[name] = o
		}
	} else if len(u.cfg.OAuth) > 0 {
		u.log.Warn("forges have oauth_client_id but [auth] secret_file is not set: login is off")
	}
	if u.cfg.AdminToken != "" {
		a.admin, a.hasAdmin = httpapi.HashToken(u.cfg.AdminToken), true
	}
	u.auth = a
	return nil
}

// registerAuth mounts login, logout and the actions (actions.go).
func (u *UI) registerAuth(rt *access.Routes) {
	rt.Handle("GET /ci/login", access.Free, u.page(u.loginPage))
	rt.Handle("GET /ci/login/{forge}", access.Free, u.page(u.loginStart))
	rt.Handle("GET /ci/oauth/{forge}/callback", access.Free, u.page(u.loginCallback))
	rt.Handle("POST /ci/logout", access.Free, http.HandlerFunc(u.logout))
	u.registerActions(rt)
}

// Caller is who makes r, for the visibility rule: an API token (front resolved it: its user, or
// a machine), the admin token (Authorization: Bearer), a logged-in user (an admin if among
// [auth] admins), or anonymous. A wrong token is anonymous here (front refuses it first on the
// routes of people).
func (u *UI) Caller(r *http.Request) access.Caller {
	if id, ok := tokenOf(r); ok {
		return u.tokenCaller(r.Context(), id)
	}
	if tok, ok := httpapi.BearerToken(r); ok {
		if u.auth.hasAdmin && u.auth.admin.Matches(tok) {
			return access.Caller{Kind: access.AdminToken, Admin: true}
		}
		return access.Caller{}
	}
	s, ok := u.session(r)
	if !ok {
		return access.Caller{}
	}
	return access.Caller{Kind: access.User, Admin: u.isAdmin(r.Context(), s.Forge, s.UserID),
		Forge: s.Forge, Login: s.Login, UserID: s.UserID}
}

// session is the request's valid session, if any. A database failure counts as none.
func (u *UI) session(r *http.Request) (session.Session, bool) {
	if u.auth == nil || u.auth.sessions == nil {
		return session.Session{}, false
	}
	s, ok, err := u.auth.sessions.Get(r)
	if err != nil {
		u.log.Warn("session check failed: treated as logged out", "error", err)
	}
	return s, ok
}

// Viewer is who looks at a page, for the header and the action buttons.
type Viewer struct {
	LoggedIn     bool
	Forge, Login string
	// CSRF is the token the page's forms carry in their hidden "csrf" field.
	CSRF string
	// LoginURL is the login page, coming back to this page; "" when no forge offers login.
	LoginURL string

	u     *UI
	r     *http.Request
	actor actor
	cache map[string]bool // "eval:12", "build:34" → may act
}

// viewer is the request's Viewer. Page handlers get it in Page.Viewer (u.page sets it).
func (u *UI) viewer(r *http.Request) Viewer {
	v := Viewer{u: u, r: r, cache: map[string]bool{}}
	if u.auth == nil || u.auth.sessions == nil {
		return v
	}
	if len(u.auth.oauth) > 0 {
		v.LoginURL = "/ci/login"
		if next := localNext(r.URL.RequestURI()); next != "" && r.Method == http.MethodGet && r.URL.Path != "/ci/login" {
			v.LoginURL += "?" + url.Values{"next": {next}}.Encode()
		}
	}
	s, ok := u.session(r)
	if !ok {
		return v
	}
	v.LoggedIn, v.Forge, v.Login = true, s.Forge, s.Login
	v.CSRF = u.auth.sessions.RequestCSRFToken(r)
	v.actor = actor{admin: u.isAdmin(r.Context(), s.Forge, s.UserID), forge: s.Forge, login: s.Login, userID: s.UserID}
	return v
}

// Admin reports whether the viewer is one of the [auth] admins.
func (v Viewer) Admin() bool { return v.LoggedIn && v.actor.admin }

// MayActOnEval reports whether the viewer may re-evaluate, rebuild or cancel evaluation id;
// the action buttons show only then. A failed check (the forge did not answer) is false.
func (v Viewer) MayActOnEval(id int64) bool {
	return v.mayAct("eval", id, v.u.mayActOnEval)
}

// MayActOnBuild reports whether the viewer may rebuild or cancel build job id.
func (v Viewer) MayActOnBuild(id int64) bool {
	return v.mayAct("build", id, v.u.mayActOnJob)
}

func (v Viewer) mayAct(kind string, id int64, check func(context.Context, actor, int64) (bool, error)) bool {
	if !v.LoggedIn || v.u == nil || v.r == nil {
		return false
	}
	key := fmt.Sprint(kind, ":", id)
	if ok, seen := v.cache[key]; seen {
		return ok
	}
	ok, err := check(v.r.Context(), v.actor, id)
	if err != nil {
		v.u.log.Warn("permission check for the page's buttons failed", "viewer", v.actor.String(), kind, id, "error", err)
	}
	v.cache[key] = ok
	return ok
}

// loginPage is GET /ci/login[?forge=name&next=/ci/...]: straight to the only forge, or a choice.
func (u *UI) loginPage(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	if u.auth.sessions == nil || len(u.auth.oauth) == 0 {
		return "", Page{}, notFound("login is not configured: no forge has oauth_client_id")
	}
	next := localNext(r.URL.Query().Get("next"))
	names := slices.Sorted(maps.Keys(u.auth.oauth))
	choice := r.URL.Query().Get("forge")
	if choice == "" && len(names) == 1 {
		choice = names[0]
	}
	if choice != "" {
		if _, ok := u.auth.oauth[choice]; !ok {
			return "", Page{}, notFound("no forge %q to log in with", choice)
		}
		http.Redirect(w, r, loginStartURL(choice, next), http.StatusFound)
		return "", Page{}, nil
	}
	type option struct{ Name, URL string }
	var opts []option
	for _, n := range names {
		opts = append(opts, option{Name: n, URL: loginStartURL(n, next)})
	}
	return "login", Page{Title: "Log in", Data: opts}, nil
}

func loginStartURL(forgeName, next string) string {
	u := "/ci/login/" + url.PathEscape(forgeName)
	if next != "" {
		u += "?" + url.Values{"next": {next}}.Encode()
	}
	return u
}

// oauthState is what the state cookie holds while the user is at the forge.
type oauthState struct {
	State   string    `json:"state"`
	Forge   string    `json:"forge"`
	Next    string    `json:"next"`
	Expires time.Time `json:"expires"`
}

// loginStart is GET /ci/login/{forge}: a fresh state in a cookie, and off to the forge.
func (u *UI) loginStart(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	name := r.PathValue("forge")
	o, ok := u.auth.oauth[name]
	if !ok || u.auth.sessions == nil {
		return "", Page{}, notFound("no forge %q to log in with", name)
	}
	m := u.auth.sessions
	st := oauthState{State: session.Random(24), Forge: name, Next: localNext(r.URL.Query().Get("next")),
		Expires: time.Now().Add(stateTTL).UTC().Truncate(time.Second)}
	v, err := m.Sign(statePurpose, st)
	if err != nil {
		return "", Page{}, err
	}
	http.SetCookie(w, u.stateCookie(r, v, st.Expires))
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, o.AuthorizeURL(st.State, u.callbackURL(r, name)), http.StatusFound)
	return "", Page{}, nil
}

// callbackURL is where the forge sends the user back: under the public URL if configured,
// else under the address the request came to.
func (u *UI) callbackURL(r *http.Request, forgeName string) string {
	return u.publicBase(r) + "/ci/oauth/" + url.PathEscape(forgeName) + "/callback"
}

// loginCallback is GET /ci/oauth/{forge}/callback?code&state.
func (u *UI) loginCallback(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	name := r.PathValue("forge")
	o, ok := u.auth.oauth[name]
	if !ok || u.auth.sessions == nil {
		return "", Page{}, notFound("no forge %q to log in with", name)
	}
	m := u.auth.sessions
	// The state cookie is single-use: clear it whatever happens next.
	clearState := u.stateCookie(r, "", time.Time{})
	clearState.MaxAge = -1
	http.SetCookie(w, clearState)

	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		return "", Page{}, &httpapi.Error{Code: http.StatusForbidden, Msg: "the forge did not log you in",
			Err: fmt.Errorf("oauth error %.60q", e)}
	}
	var st oauthState
	c, err := r.Cookie(m.Name(stateCookie))
	if err != nil || m.Verify(statePurpose, c.Value, &st) != nil || !time.Now().Before(st.Expires) {
		return "", Page{}, httpapi.Errorf(http.StatusBadRequest, "the login has expired or was started elsewhere: log in again")
	}
	got := q.Get("state")
	if st.Forge != name || got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(st.State)) != 1 {
		return "", Page{}, httpapi.Errorf(http.StatusBadRequest, "the login's state does not match: log in again")
	}
	code := q.Get("code")
	if code == "" {
		return "", Page{}, httpapi.Errorf(http.StatusBadRequest, "the forge sent no code")
	}
	token, err := o.Exchange(r.Context(), code, u.callbackURL(r, name))
	if err != nil {
		return "", Page{}, &httpapi.Error{Code: http.StatusBadGateway, Msg: "the forge refused the login", Err: err}
	}
	user, err := o.User(r.Context(), token)
	if err != nil {
		return "", Page{}, &httpapi.Error{Code: http.StatusBadGateway, Msg: "the forge did not say who you are", Err: err}
	}
	if _, err := m.Login(r.Context(), w, r, name, user.ID, user.Login); err != nil {
		return "", Page{}, err
	}
	u.log.Info("login", "forge", name, "login", user.Login, "user_id", user.ID)
	next := st.Next
	if next == "" {
		next = "/ci/"
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, next, http.StatusSeeOther)
	return "", Page{}, nil
}

// logout is POST /ci/logout: the session cookie cleared, CSRF-checked when there is one.
func (u *UI) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxActionBody)
	if _, ok := u.session(r); ok {
		if err := u.auth.sessions.CheckCSRF(r); err != nil {
			u.fail(w, r, &httpapi.Error{Code: http.StatusForbidden, Msg: "cross-site request refused: reload the page and try again", Err: err}, "/ci/")
			return
		}
	}
	if u.auth.sessions != nil {
		if err := u.auth.sessions.Logout(r.Context(), w, r); err != nil {
			u.fail(w, r, err, "/ci/")
			return
		}
	}
	if !browserForm(r) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"message": "logged out"})
		return
	}
	http.Redirect(w, r, "/ci/", http.StatusSeeOther)
}

// stateCookie is the OAuth state cookie: only the callback needs it, so its path is
// /ci/oauth/, except where __Host- cookies must have Path=/.
func (u *UI) stateCookie(r *http.Request, value string, expires time.Time) *http.Cookie {
	m := u.auth.sessions
	c := m.Cookie(r, m.Name(stateCookie), value, expires)
	if !m.HTTPS() {
		c.Path = "/ci/oauth/"
	}
	return c
}

// localNext returns next if it is a path of the UI ("/ci/..."), "" otherwise: the login must
// not send users to another site.
func localNext(next string) string {
	if next == "" || len(next) > 2000 || !strings.HasPrefix(next, "/ci/") || strings.ContainsAny(next, "\\\r\n\t") {
		return ""
	}
	p, err := url.Parse(next)
	if err != nil || p.Scheme != "" || p.Host != "" || p.User != nil || p.Opaque != "" {
		return ""
	}
	if clean := path.Clean(p.Path); clean != "/ci" && !strings.HasPrefix(clean, "/ci/") {
		return ""
	}
	return next
}
