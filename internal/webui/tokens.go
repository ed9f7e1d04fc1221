package webui

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/apitoken"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// A user's own cache tokens, with which their Nix clients read the private store paths of the
// projects they may read:
//
//	GET  /ci/tokens              the viewer's tokens (an admin's: everyone's) and the mint form
//	POST /ci/tokens              mint one; the answer shows it, once
//	POST /ci/tokens/{id}/revoke  revoke one of the viewer's (an admin: anyone's)
//
// A token carries its user's forge permissions: at mint it records the user (forge and user
// id, and the login the forge is asked with) and the projects the visibility rule lets them
// read, and the maintenance leader's refresh (TokenRefreshTask) asks the forge again every few
// minutes. The POSTs are CSRF-checked as the actions are.

// DefaultTokenRefresh is how often the maintenance leader recomputes the projects of users'
// cache tokens from the forges: a permission the forge takes back stops the token within it.
const DefaultTokenRefresh = 5 * time.Minute

// tokenDays are the lifetimes a user chooses from, in days; defaultTokenDays is preselected.
var tokenDays = []int{7, 30, 90, 365}

const defaultTokenDays = 90

// maxTokenNote bounds a token's note; maxTokensListed the tokens a page lists;
// maxLiveTokens a user's live tokens (each costs nothing to refresh, but nobody needs more).
const (
	maxTokenNote    = 200
	maxTokensListed = 500
	maxLiveTokens   = 50
)

// TokenRow is a cache token as the tokens page lists it (never the token itself).
type TokenRow struct {
	ID        int64
	Note      string
	Owner     string // "forge:login"; "" for an admin's token (harmonia-ci cache-token)
	Projects  []string
	ExpiresAt time.Time
	RevokedAt *time.Time
	CreatedAt time.Time
	Live      bool
}

// MintedToken is a token just minted: the page that answers the mint shows it, and never again.
type MintedToken struct {
	ID        int64
	Token     string
	ExpiresAt time.Time
	Projects  []string
	// Netrc is the netrc-file line of each cache host.
	Netrc []string
}

// TokensPage is the tokens page's data.
type TokensPage struct {
	Tokens   []TokenRow
	All      bool // an admin's view: everyone's tokens
	Days     []int
	Default  int
	Minted   *MintedToken
	Notice   string
	Sources  CacheSources
	Projects int // how many projects a new token would read now
	// APITokens are the viewer's API tokens (an admin's: everyone's, machine tokens included);
	// MintedAPI the one just minted.
	APITokens []APITokenRow
	MintedAPI *MintedAPIToken
}

// tokenNotices are the tokens page's messages after a redirect.
var tokenNotices = map[string]string{"revoked": "Token revoked: caches refuse it from its next request.",
	"api-revoked": "API token revoked: the API refuses it from its next request."}

func (u *UI) registerTokens(rt *access.Routes) {
	// The pages list projects' names: each passes through the visibility rule (tokenRows).
	rt.Handle("GET /ci/tokens", access.Filtered, u.page(u.tokensPage))
	rt.Handle("POST /ci/tokens", access.Filtered, http.HandlerFunc(u.mintToken))
	rt.Handle("POST /ci/tokens/{id}/revoke", access.Filtered, http.HandlerFunc(u.revokeToken))
	// Personal API tokens (apitokens.go) and the command line's login (clilogin.go).
	rt.Handle("POST /ci/tokens/api", access.Filtered, http.HandlerFunc(u.mintAPIToken))
	rt.Handle("POST /ci/tokens/api/{id}/revoke", access.Filtered, http.HandlerFunc(u.revokeAPIToken))
	rt.Handle("GET /ci/tokens/cli", access.Free, u.page(u.cliLoginPage))
	rt.Handle("POST /ci/tokens/cli", access.Free, http.HandlerFunc(u.cliLoginMint))
}

// tokensPage is GET /ci/tokens[?notice=…]: a logged-out browser is sent to the login.
func (u *UI) tokensPage(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	s, in := u.session(r)
	if !in {
		if u.auth.sessions != nil && len(u.auth.oauth) > 0 {
			http.Redirect(w, r, "/ci/login?"+url.Values{"next": {"/ci/tokens"}}.Encode(), http.StatusFound)
			return "", Page{}, nil
		}
		return "", Page{}, httpapi.Errorf(http.StatusUnauthorized, "log in first: tokens are minted by logged-in users")
	}
	who := actor{admin: u.isAdmin(r.Context(), s.Forge, s.UserID), forge: s.Forge, login: s.Login, userID: s.UserID}
	d, err := u.tokensData(r, who)
	if err != nil {
		return "", Page{}, err
	}
	d.Notice = tokenNotices[r.URL.Query().Get("notice")]
	return "tokens", Page{Title: "Tokens", Nav: "tokens", Data: d}, nil
}

// tokensData is the page's data for who: their tokens (an admin's: all) and the cache.
func (u *UI) tokensData(r *http.Request, who actor) (TokensPage, error) {
	ctx := r.Context()
	d := TokensPage{All: who.admin, Days: tokenDays, Default: defaultTokenDays}
	forgeName := who.forge
	if who.admin {
		forgeName = ""
	}
	rows, err := u.cfg.Pool.Query(ctx, sqlUserTokens, forgeName, who.userID, maxTokensListed)
	if err != nil {
		return d, fmt.Errorf("cache tokens: %w", err)
	}
	var ids [][]int64
	d.Tokens, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (TokenRow, error) {
		var t TokenRow
		var p []int64
		err := row.Scan(&t.ID, &t.Note, &t.Owner, &p, &t.ExpiresAt, &t.RevokedAt, &t.CreatedAt, &t.Live)
		ids = append(ids, p)
		return t, err
	})
	if err != nil {
		return d, fmt.Errorf("cache tokens: %w", err)
	}
	projects, err := u.projectRepos(ctx)
	if err != nil {
		return d, err
	}
	c := who.caller()
	seen := map[int64]bool{}
	for i := range d.Tokens {
		for _, id := range ids[i] {
			p, ok := projects[id]
			if !ok {
				continue
			}
			// A name the viewer may no longer read is left out (the refresh drops it soon).
			visible, known := seen[id]
			if !known {
				visible, _ = u.rule.MayRead(ctx, c, p.repo)
				seen[id] = visible
			}
			if visible {
				d.Tokens[i].Projects = append(d.Tokens[i].Projects, p.name)
			}
		}
		slices.Sort(d.Tokens[i].Projects)
	}
	if d.Sources, err = u.cacheSources(ctx, false); err != nil {
		return d, err
	}
	d.APITokens, err = apitoken.List(ctx, u.cfg.Pool, forgeName, who.userID, maxTokensListed)
	return d, err
}

// caller is the actor as the visibility rule sees them.
func (a actor) caller() access.Caller {
	if a.token {
		return access.Caller{Kind: access.AdminToken, Admin: true}
	}
	return access.Caller{Kind: access.User, Admin: a.admin, Forge: a.forge, Login: a.login, UserID: a.userID}
}

// projectRepo is a project's name and repository.
type projectRepo struct {
	name string
	repo access.Repo
}

// projectRepos is every project's repository, by project id.
func (u *UI) projectRepos(ctx context.Context) (map[int64]projectRepo, error) {
	rows, err := u.cfg.Pool.Query(ctx, sqlProjectRepos)
	if err != nil {
		return nil, fmt.Errorf("projects: %w", err)
	}
	out := map[int64]projectRepo{}
	var id int64
	var p projectRepo
	_, err = pgx.ForEachRow(rows, []any{&id, &p.name, &p.repo.Private, &p.repo.Forge, &p.repo.FullName, &p.repo.Installation}, func() error {
		out[id] = p
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("projects: %w", err)
	}
	return out, nil
}

// readable is the ids of the projects c may read by rule, sorted; a forge that does not
// answer is an error, never a guess.
func readable(ctx context.Context, rule *access.Rule, c access.Caller, projects map[int64]projectRepo) ([]int64, error) {
	ids := []int64{}
	for id, p := range projects {
		ok, err := rule.MayRead(ctx, c, p.repo)
		if err != nil {
			return nil, err
		}
		if ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// tokenPost bounds a tokens POST and authenticates it (the session and its CSRF token, or the
// admin token).
func (u *UI) tokenPost(w http.ResponseWriter, r *http.Request) (*http.Request, actor, context.CancelFunc, error) {
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	r = r.WithContext(ctx)
	r.Body = http.MaxBytesReader(w, r.Body, maxActionBody)
	who, err := u.authenticate(r)
	return r, who, cancel, err
}

// mintToken is POST /ci/tokens (note, days): a token for the session's user, reading the
// projects they may read now. The answer shows it once: a page (200, never cached), or JSON.
func (u *UI) mintToken(w http.ResponseWriter, r *http.Request) {
	r, who, cancel, err := u.userPost(w, r)
	defer cancel()
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	ctx := r.Context()
	note := strings.TrimSpace(r.PostFormValue("note"))
	days, err := formDays(r)
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	if len(note) > maxTokenNote || strings.ContainsFunc(note, func(c rune) bool { return c < ' ' }) {
		u.fail(w, r, badRequest("the note must be one line of at most %d bytes", maxTokenNote), "/ci/tokens")
		return
	}
	projects, err := u.projectRepos(ctx)
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	ids, err := readable(ctx, u.rule, who.caller(), projects)
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	token, err := cache.NewToken()
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	h := httpapi.HashToken(token)
	m := MintedToken{Token: token}
	err = u.cfg.Pool.QueryRow(ctx, sqlUserTokenInsert, h[:], note, ids, days, who.forge, who.userID, who.login, maxLiveTokens).Scan(&m.ID, &m.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		u.fail(w, r, httpapi.Errorf(http.StatusConflict, "you have %d live cache tokens: revoke one first", maxLiveTokens), "/ci/tokens")
		return
	}
	if err != nil {
		u.fail(w, r, fmt.Errorf("mint cache token: %w", err), "/ci/tokens")
		return
	}
	for _, id := range ids {
		m.Projects = append(m.Projects, projects[id].name)
	}
	slices.Sort(m.Projects)
	u.log.Info("cache token minted", "id", m.ID, "by", who.String(), "projects", len(ids), "days", days)
	if !browserForm(r) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"id": m.ID, "token": token, "expires_at": m.ExpiresAt, "projects": m.Projects})
		return
	}
	u.mintedPage(w, r, who, func(d *TokensPage) {
		for _, host := range d.Sources.Hosts() {
			m.Netrc = append(m.Netrc, netrcLine(host, token))
		}
		d.Minted = &m
	})
}

// revokeToken is POST /ci/tokens/{id}/revoke: one of the user's cache tokens (an admin:
// anyone's) revoked. Someone else's token answers as one that does not exist.
func (u *UI) revokeToken(w http.ResponseWriter, r *http.Request) {
	u.revoke(w, r, "cache token", "revoked", func(ctx context.Context, id int64, forgeName string, userID int64) (bool, error) {
		tag, err := u.cfg.Pool.Exec(ctx, sqlUserTokenRevoke, id, forgeName, userID)
		return tag.RowsAffected() > 0, err
	})
}

// revoke revokes token {id} of the kind what, if it is the viewer's (an admin: anyone's), with
// do, and answers: back to the tokens page with notice, or JSON.
func (u *UI) revoke(w http.ResponseWriter, r *http.Request, what, notice string,
	do func(ctx context.Context, id int64, forgeName string, userID int64) (bool, error)) {
	r, who, cancel, err := u.tokenPost(w, r)
	defer cancel()
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	if !who.admin && who.userID == 0 {
		// A machine token that is not the admin's owns no token; an empty forge would
		// otherwise mean anyone's.
		u.fail(w, r, httpapi.Errorf(http.StatusForbidden, "this token may not revoke tokens"), "/ci/tokens")
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		u.fail(w, r, notFound("no %s %.40q", what, r.PathValue("id")), "/ci/tokens")
		return
	}
	forgeName := who.forge
	if who.admin {
		forgeName = ""
	}
	ok, err := do(r.Context(), id, forgeName, who.userID)
	switch {
	case err != nil:
		u.fail(w, r, fmt.Errorf("revoke %s %d: %w", what, id, err), "/ci/tokens")
		return
	case !ok:
		u.fail(w, r, notFound("no live %s %d of yours", what, id), "/ci/tokens")
		return
	}
	u.log.Info(what+" revoked", "id", id, "by", who.String())
	if !browserForm(r) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"message": "revoked", "id": id})
		return
	}
	http.Redirect(w, r, "/ci/tokens?notice="+notice, http.StatusSeeOther)
}

// mintedPage answers a mint from a browser: the tokens page, with what set shows once.
func (u *UI) mintedPage(w http.ResponseWriter, r *http.Request, who actor, set func(*TokensPage)) {
	d, err := u.tokensData(r, who)
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	set(&d)
	p := Page{Title: "Tokens", Nav: "tokens", Data: d, Scripts: u.scripts, Viewer: u.viewer(r)}
	u.render(w, http.StatusOK, "tokens", p)
}

// formDays is a mint form's "days": one of tokenDays, defaultTokenDays when absent.
func formDays(r *http.Request) (int, error) {
	s := r.PostFormValue("days")
	if s == "" {
		return defaultTokenDays, nil
	}
	days, err := strconv.Atoi(s)
	if err != nil || !slices.Contains(tokenDays, days) {
		return 0, badRequest("days must be one of %s", joinInts(tokenDays))
	}
	return days, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// TokenRefreshTask is the maintenance leader's refresh of users' cache tokens: every interval
// (default DefaultTokenRefresh) it asks the forges, afresh (not through the permission cache),
// which projects each token's user may read now, and writes that as the token's projects.
// A user whose answer fails keeps their tokens' projects until a refresh succeeds, but a
// token not refreshed for an hour reads nothing (the cache's token lookup): a forge outage
// fails closed.
func (u *UI) TokenRefreshTask(interval time.Duration) cluster.Task {
	return cluster.Task{Name: "cache-token-refresh", Interval: cmp.Or(interval, DefaultTokenRefresh),
		Prepare: func(ctx context.Context) (func(context.Context, pgx.Tx) (int64, error), error) {
			updates, err := u.refreshTokens(ctx)
			if err != nil || len(updates) == 0 {
				return nil, err
			}
			return func(ctx context.Context, tx pgx.Tx) (int64, error) {
				var n int64
				for _, up := range updates {
					tag, err := tx.Exec(ctx, sqlUserTokenRefresh, up.tokens, up.projects)
					if err != nil {
						return n, fmt.Errorf("refresh cache tokens: %w", err)
					}
					n += tag.RowsAffected()
				}
				return n, nil
			}, nil
		}}
}

// tokenUpdate is what a refresh writes: tokens read projects.
type tokenUpdate struct {
	tokens, projects []int64
}

// tokenUser is whose tokens: a forge's user, and the login recorded with the tokens.
type tokenUser struct {
	forge  string
	userID int64
	login  string
}

// refreshTokens computes each live user token's projects from the forges.
func (u *UI) refreshTokens(ctx context.Context) ([]tokenUpdate, error) {
	rows, err := u.cfg.Pool.Query(ctx, sqlLiveUserTokens)
	if err != nil {
		return nil, fmt.Errorf("live cache tokens: %w", err)
	}
	byUser := map[tokenUser][]int64{}
	var order []tokenUser
	var id int64
	var k tokenUser
	_, err = pgx.ForEachRow(rows, []any{&id, &k.forge, &k.userID, &k.login}, func() error {
		if _, ok := byUser[k]; !ok {
			order = append(order, k)
		}
		byUser[k] = append(byUser[k], id)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("live cache tokens: %w", err)
	}
	if len(order) == 0 {
		return nil, nil
	}
	projects, err := u.projectRepos(ctx)
	if err != nil {
		return nil, err
	}
	fresh := &access.Rule{DB: u.cfg.Pool, Read: u.freshReadAccess}
	var out []tokenUpdate
	for _, k := range order {
		ids, err := u.userProjects(ctx, fresh, k, projects)
		if err != nil {
			u.log.Warn("cache tokens not refreshed: they keep their projects for now", "forge", k.forge, "login", k.login, "error", err)
			continue
		}
		out = append(out, tokenUpdate{tokens: byUser[k], projects: ids})
	}
	return out, nil
}

// userProjects is the projects user k may read now, asked of the forge; none when the forge is
// not configured any more or the login is someone else's now.
func (u *UI) userProjects(ctx context.Context, rule *access.Rule, k tokenUser, projects map[int64]projectRepo) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, actionTimeout)
	defer cancel()
	f, ok := u.cfg.Forges[k.forge]
	if !ok {
		return []int64{}, nil
	}
	id, err := f.UserID(ctx, k.login)
	switch {
	case errors.Is(err, forge.ErrNotFound) || (err == nil && id != k.userID):
		return []int64{}, nil // renamed: the login lends its new holder's access to nobody
	case err != nil:
		return nil, fmt.Errorf("who has %s:%s: %w", k.forge, k.login, err)
	}
	c := access.Caller{Kind: access.User, Admin: u.isAdmin(ctx, k.forge, k.userID), Forge: k.forge, Login: k.login, UserID: k.userID}
	return readable(ctx, rule, c, projects)
}

// freshReadAccess is readAccess asked of the forge itself, not of the permission cache.
func (u *UI) freshReadAccess(ctx context.Context, c access.Caller, repo access.Repo) (bool, error) {
	f, r, ok := u.targetRepo(target{Forge: repo.Forge, FullName: repo.FullName, Installation: repo.Installation})
	if !ok {
		return false, nil
	}
	p, err := f.Permission(ctx, r, c.Login)
	if err != nil {
		return false, fmt.Errorf("permission of %s on %s:%s: %w", c.Login, repo.Forge, repo.FullName, err)
	}
	return p.CanRead(), nil
}
