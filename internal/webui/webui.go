// Package webui is harmonia-ci's web interface under /ci/: server-rendered HTML pages (the
// dashboard, projects, evaluations, builds, nodes, the queue) that work without JavaScript,
// enhanced with HTMX for live updates over server-sent events. Templates, the stylesheet and
// the HTMX scripts (fetched from npm at build time by scripts/assets.sh) are embedded.
package webui

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
)

//go:embed templates static
var files embed.FS

// Vendored scripts, as scripts/assets.sh names them.
const (
	htmxScript = "vendor/htmx.org-2.0.8-htmx.min.js"
	sseScript  = "vendor/htmx-ext-sse-2.2.4-sse.min.js"
)

// PageSize is how many rows a list shows before "Load more".
const PageSize = 25

// Config is what the UI needs from the node.
type Config struct {
	Pool   *pgxpool.Pool
	Forges forge.Set
	// Notifier is the process's LISTEN session; the live updates subscribe through it.
	Notifier *notify.Notifier
	Logger   *slog.Logger

	// Login and actions (auth.go, actions.go, permission.go).
	// Secret signs the login cookies ([auth] secret_file); nil turns login off, and then only
	// the admin token can act.
	Secret []byte
	// Admins may do anything, as "forge:login" ([auth] admins), each bound to a forge user id
	// (admins.go).
	Admins []string
	// AdminToken lets scripts act (Authorization: Bearer); "" turns that off.
	AdminToken string
	// PublicURL is where users reach the UI: the OAuth callbacks are under it. "" derives it
	// from each request's Host.
	PublicURL string
	// OAuth are the forges users log in with, by [[forges]] name.
	OAuth map[string]forge.OAuth
	// PermissionTTL is how long a forge's answer about a user's permission is reused; 0 means
	// DefaultPermissionTTL (5 min).
	PermissionTTL time.Duration

	// Where Nix clients substitute from (the project pages' snippets, substitute.go).
	// CacheURL is [cache] public_url; "" lists the live cache nodes' endpoints, those heard
	// from within DeadThreshold (default cluster.DefaultDeadThreshold).
	CacheURL      string
	DeadThreshold time.Duration

	// RateLimits are the API's (apitokens.go).
	RateLimits RateLimits
}

// UI serves the pages.
type UI struct {
	cfg    Config
	log    *slog.Logger
	pages  map[string]*template.Template
	static fs.FS
	// scripts is false when the build did not embed HTMX: pages then work without it.
	scripts bool
	hub     *hub  // live updates
	auth    *auth // login, sessions and permissions (auth.go)
	// rule is the visibility rule, with the forges' answers through the permission cache
	// (permission.go): every page and stream asks it.
	rule *access.Rule
	// limits are the API's token buckets.
	limits limiters
}

// New parses the templates.
func New(cfg Config) (*UI, error) {
	u := &UI{cfg: cfg, log: cfg.Logger.With("service", "webui"), pages: map[string]*template.Template{}}
	static, err := fs.Sub(files, "static")
	if err != nil {
		return nil, err
	}
	u.static = static
	if err := u.initAuth(); err != nil {
		return nil, err
	}
	u.rule = &access.Rule{DB: cfg.Pool, Read: u.readAccess}
	u.limits = newLimiters(cfg.RateLimits)
	_, errH := fs.Stat(static, htmxScript)
	_, errS := fs.Stat(static, sseScript)
	u.scripts = errH == nil && errS == nil
	if !u.scripts {
		u.log.Warn("this binary was built without HTMX (run scripts/assets.sh before building): pages work, but do not update live")
	}
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/parts/*.html")
	if err != nil {
		return nil, fmt.Errorf("web UI templates: %w", err)
	}
	pages, err := fs.Glob(files, "templates/*.html")
	if err != nil {
		return nil, err
	}
	for _, p := range pages {
		name := path.Base(p)
		if name == "layout.html" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(files, p)
		if err != nil {
			return nil, fmt.Errorf("web UI template %s: %w", name, err)
		}
		u.pages[strings.TrimSuffix(name, ".html")] = t
	}
	return u, nil
}

// Register mounts the pages under /ci/, and makes the UI's rule and callers (sessions, the
// admin token, the forges' answers) those of every route of rt: the node's live logs and
// cluster API see the same users as the pages.
func (u *UI) Register(rt *access.Routes) {
	rt.Use(u.rule, u.Caller)
	rt.SetFront(u.front) // bearer tokens and the API's rate limits (apitokens.go)
	rt.Handle("GET /ci/static/", access.Free, http.StripPrefix("/ci/static/", u.staticHandler()))
	rt.Handle("GET /{$}", access.Free, http.RedirectHandler("/ci/", http.StatusFound))
	rt.Handle("GET /ci/{$}", access.Filtered, u.page(u.dashboard))
	u.registerEvalPages(rt)   // evaluation and build pages (eval.go, build.go)
	u.registerBrowsePages(rt) // project, nodes and queue pages (browse.go)
	u.registerEvents(rt)      // live updates over SSE (events.go)
	u.registerAuth(rt)        // login, logout and the actions (auth.go, actions.go)
	u.registerSettings(rt)    // the admins' project settings (settings.go)
	u.registerTokens(rt)      // users' cache tokens (tokens.go)
}

func (u *UI) staticHandler() http.Handler {
	files := http.FileServerFS(u.static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Vendored files carry their version in their name: cache them for good.
		if strings.HasPrefix(r.URL.Path, "vendor/") {
			w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			w.Header().Set("Cache-Control", "public, max-age=300")
		}
		files.ServeHTTP(w, r)
	})
}

// Page is what every page template gets: the page's own data and what the layout needs.
type Page struct {
	Title   string
	Nav     string // which navigation entry is current
	Scripts bool   // HTMX is embedded
	Data    any
	// Viewer is who looks: the header's login and the action buttons (auth.go). u.page sets it.
	Viewer Viewer
}

// pageFunc computes a page: its template, title, navigation entry and data.
type pageFunc func(w http.ResponseWriter, r *http.Request) (name string, p Page, err error)

// page renders a pageFunc's result, and its errors as an HTML error page.
func (u *UI) page(f pageFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), httpapi.DBTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		name, p, err := f(w, r)
		if err != nil {
			u.renderError(w, r, err)
			return
		}
		if name == "" {
			return // the page answered itself (a redirect)
		}
		p.Scripts = u.scripts
		p.Viewer = u.viewer(r)
		u.render(w, http.StatusOK, name, p)
	})
}

// render executes a page template into a buffer first, so a template error is a clean 500.
func (u *UI) render(w http.ResponseWriter, code int, name string, p Page) {
	t, ok := u.pages[name]
	if !ok {
		u.log.Error("no such page template", "template", name)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout.html", p); err != nil {
		u.log.Error("render page", "template", name, "error", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// renderError shows an httpapi.Error's message, and only "internal error" for anything else.
func (u *UI) renderError(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := http.StatusInternalServerError, "internal error"
	var he *httpapi.Error
	switch {
	case errors.As(err, &he):
		code, msg = he.Code, he.Msg
	case db.Unavailable(err):
		code, msg = http.StatusServiceUnavailable, "database unavailable"
	}
	level := slog.LevelInfo
	if code >= 500 {
		level = slog.LevelError
	}
	u.log.Log(r.Context(), level, "page failed", "path", r.URL.Path, "status", code, "error", err)
	u.render(w, code, "error", Page{Title: http.StatusText(code), Scripts: u.scripts, Data: msg, Viewer: u.viewer(r)})
}

// notFound is the error of a page about something that does not exist.
func notFound(format string, args ...any) error {
	return httpapi.Errorf(http.StatusNotFound, format, args...)
}
