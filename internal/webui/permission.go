package webui

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// Who may act (on rebuild, cancel and re-evaluate):
//   - the admin token (scripts) and the [auth] admins ("forge:login", resolved to forge user
//     ids in admins.go) may do anything;
//   - on an evaluation of a pull request, its author (logged in with the repository's forge),
//     matched by forge user id, never by login (a login can be renamed and taken);
//   - on any evaluation of a repository, users the forge gives write access to it
//     (forge.WriteAccess, the check webhooks make too), asked of the forge and remembered for
//     PermissionTTL;
//   - a build job is shared by every live evaluation interested in it: jobaccess.go says what
//     each user may do to it; a job no live evaluation needs belongs to the evaluations whose
//     attributes include it (directly or in their closure) and to the project it was queued
//     for, and whoever may act on one of those may act on it (mayActOnBuild);
//   - projects added by URL (forge 'git') have no forge to ask: admins only.
//
// Who may see: the visibility rule (internal/access): public repositories everyone; private
// ones users with read access (and admins), see canSee and readAccess.

// DefaultPermissionTTL is how long a forge's answer about a user's permission is reused.
const DefaultPermissionTTL = 5 * time.Minute

// forgeGit is the forge of projects added by URL.
const forgeGit = "git"

// actor is who asks for an action: the admin token, or a logged-in user.
type actor struct {
	token        bool // the admin token: anything, and no CSRF token needed
	admin        bool // the token or an [auth] admin
	forge, login string
	// userID is the forge's numeric id of the user: who they are. login is only for the
	// forge's permission API and logs.
	userID int64
	// tokenID and tokenName are the API token the actor authenticated with (0: none); with
	// token true, a machine token minted admin.
	tokenID   int64
	tokenName string
}

func (a actor) String() string {
	switch {
	case a.token && a.tokenID != 0:
		return fmt.Sprintf("machine token %d", a.tokenID)
	case a.token:
		return "the admin token"
	case a.login == "" && a.tokenID != 0:
		return fmt.Sprintf("machine token %d", a.tokenID)
	}
	return a.forge + ":" + a.login
}

// target is a repository an action touches, with the pull request author's forge user id
// when it is an evaluation of a pull request (0: none, or not recorded).
type target struct {
	Forge, FullName string
	Installation    int64
	Private         bool
	PRAuthorID      int64
}

// isAdmin reports whether the forge's user userID is one of the [auth] admins.
func (u *UI) isAdmin(ctx context.Context, forgeName string, userID int64) bool {
	return u.auth.admins.is(ctx, forgeName, userID)
}

// mayAct reports whether a may act on something that belongs to targets.
func (u *UI) mayAct(ctx context.Context, a actor, targets []target) (bool, error) {
	if a.admin {
		return true, nil
	}
	if a.login == "" {
		return false, nil
	}
	for _, t := range targets {
		if t.Forge == a.forge && a.userID > 0 && t.PRAuthorID == a.userID {
			return true, nil
		}
	}
	var firstErr error
	asked := map[string]bool{}
	for _, t := range targets {
		key := strings.ToLower(t.FullName)
		if t.Forge != a.forge || t.Forge == forgeGit || asked[key] {
			continue
		}
		asked[key] = true
		w, err := u.writeAccess(ctx, t, a.login, a.userID)
		if err != nil {
			firstErr = cmpErr(firstErr, err)
			continue
		}
		if w {
			return true, nil
		}
	}
	return false, firstErr
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// targetRepo is t's forge and repository; false for a forge no longer configured (nobody to
// ask) or a name that is not owner/name.
func (u *UI) targetRepo(t target) (forge.Forge, forge.Repo, bool) {
	f, ok := u.cfg.Forges[t.Forge]
	if !ok {
		return nil, forge.Repo{}, false
	}
	owner, name, ok := strings.Cut(t.FullName, "/")
	if !ok {
		return nil, forge.Repo{}, false
	}
	return f, forge.Repo{Owner: owner, Name: name, InstallationID: t.Installation}, true
}

// stillTheirs reports whether login still belongs to the user userID, who had it when they
// logged in: a login renamed and taken by someone else lends its new holder's access to nobody.
func (u *UI) stillTheirs(ctx context.Context, f forge.Forge, login string, userID int64) (bool, error) {
	same, err := u.auth.logins.is(ctx, f, login, userID)
	if err != nil {
		return false, forgeUnavailable(err)
	}
	return same, nil
}

// permission is the permission on t's repository of the user userID, whose login was login
// when they logged in: none if someone else has that login now. From the cache or the forge.
func (u *UI) permission(ctx context.Context, t target, login string, userID int64) (forge.Permission, error) {
	f, repo, ok := u.targetRepo(t)
	if !ok {
		return forge.PermissionNone, nil
	}
	if same, err := u.stillTheirs(ctx, f, login, userID); err != nil || !same {
		return forge.PermissionNone, err
	}
	p, err := u.auth.perms.get(ctx, f, repo, login)
	if err != nil {
		return forge.PermissionNone, forgeUnavailable(err)
	}
	return p, nil
}

// writeAccess reports whether the user userID (login when they logged in) may act on t's
// repository: forge.WriteAccess, the check webhooks make of pull request senders and
// approvers, asked through the cache.
func (u *UI) writeAccess(ctx context.Context, t target, login string, userID int64) (bool, error) {
	f, repo, ok := u.targetRepo(t)
	if !ok {
		return false, nil
	}
	if same, err := u.stillTheirs(ctx, f, login, userID); err != nil || !same {
		return false, err
	}
	w, err := forge.WriteAccess(ctx, cachedPermissions{u.auth.perms, f}, repo, login)
	if err != nil {
		return false, forgeUnavailable(err)
	}
	return w, nil
}

// cachedPermissions answers a forge's Permission from the cache.
type cachedPermissions struct {
	cache *permCache
	forge forge.Forge
}

func (c cachedPermissions) Permission(ctx context.Context, repo forge.Repo, login string) (forge.Permission, error) {
	return c.cache.get(ctx, c.forge, repo, login)
}

// canSee reports whether the request's caller may see a repository: the visibility rule
// (access.Rule.MayRead). The page handlers call it for each project, evaluation or build they
// list; the routes of one project, evaluation or build are checked before their handler runs
// (access.Routes).
func (u *UI) canSee(r *http.Request, repoPrivate bool, forgeName, fullName string) (bool, error) {
	repo := access.Repo{Private: repoPrivate, Forge: forgeName, FullName: fullName}
	if !repo.Private { // everyone's: no need to look the session up for each public row
		return u.rule.MayRead(r.Context(), access.Caller{}, repo)
	}
	return u.rule.MayRead(r.Context(), u.Caller(r), repo)
}

// readAccess is the forge's answer for the rule (access.ReadFunc): whether the user c, who had
// c.Login when they logged in, may read repo; asked through the permission cache.
func (u *UI) readAccess(ctx context.Context, c access.Caller, repo access.Repo) (bool, error) {
	p, err := u.permission(ctx, target{Forge: repo.Forge, FullName: repo.FullName, Installation: repo.Installation}, c.Login, c.UserID)
	if err != nil {
		return false, err
	}
	return p.CanRead(), nil
}

func scanTargets(rows pgx.Rows) ([]target, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (target, error) {
		var t target
		var f *string
		err := row.Scan(&f, &t.FullName, &t.Installation, &t.Private, &t.PRAuthorID)
		if f != nil {
			t.Forge = *f
		}
		return t, err
	})
}

// evalTargets is the evaluation's repository; a 404 if there is no such evaluation.
func (u *UI) evalTargets(ctx context.Context, id int64) ([]target, error) {
	rows, err := u.cfg.Pool.Query(ctx, sqlEvalTarget, id)
	if err != nil {
		return nil, err
	}
	ts, err := scanTargets(rows)
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, notFound("no evaluation %d", id)
	}
	return ts, nil
}

// mayActOnEval reports whether a may act on evaluation id (a 404 if there is none).
func (u *UI) mayActOnEval(ctx context.Context, a actor, id int64) (bool, error) {
	ts, err := u.evalTargets(ctx, id)
	if err != nil {
		return false, err
	}
	return u.mayAct(ctx, a, ts)
}

// mayActOnBuild reports whether a may act on build job id (a 404 if there is none): first
// by the evaluations that have it as an attribute and its project, and only if those do not
// allow it by the evaluations that need it as a dependency.
func (u *UI) mayActOnBuild(ctx context.Context, a actor, id int64) (bool, error) {
	rows, err := u.cfg.Pool.Query(ctx, sqlBuildTargets, id)
	if err != nil {
		return false, err
	}
	ts, err := scanTargets(rows)
	if err != nil {
		return false, err
	}
	if len(ts) == 0 {
		return false, notFound("no build %d", id)
	}
	if a.admin {
		return true, nil
	}
	ok, err := u.mayAct(ctx, a, ts)
	if ok || a.login == "" {
		return ok, err
	}
	rows, err = u.cfg.Pool.Query(ctx, sqlBuildClosureTargets, id)
	if err != nil {
		return false, err
	}
	more, err := scanTargets(rows)
	if err != nil {
		return false, err
	}
	ok, err2 := u.mayAct(ctx, a, slices.DeleteFunc(more, func(t target) bool { return slices.Contains(ts, t) }))
	return ok, cmpErr(err, err2)
}

// forgeUnavailable is the answer when the forge could not say whether a user may act.
func forgeUnavailable(err error) error {
	return &httpapi.Error{Code: http.StatusBadGateway, Msg: "the forge did not answer the permission check; try again", Err: err}
}

// permCache remembers the forges' answers about users' permissions for a while, per (forge,
// repository, login). Errors are not remembered.
type permCache struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[permKey]permEntry
}

type permKey struct{ forge, repo, login string }

type permEntry struct {
	perm    forge.Permission
	expires time.Time
}

// permCacheMax bounds the cache; past it expired entries are dropped, and if that is not
// enough, everything.
const permCacheMax = 10000

func newPermCache(ttl time.Duration) *permCache {
	if ttl <= 0 {
		ttl = DefaultPermissionTTL
	}
	return &permCache{ttl: ttl, now: time.Now, entries: map[permKey]permEntry{}}
}

func (c *permCache) get(ctx context.Context, f forge.Forge, repo forge.Repo, login string) (forge.Permission, error) {
	k := permKey{f.Name(), strings.ToLower(repo.FullName()), strings.ToLower(login)}
	c.mu.Lock()
	e, ok := c.entries[k]
	c.mu.Unlock()
	if ok && c.now().Before(e.expires) {
		return e.perm, nil
	}
	p, err := f.Permission(ctx, repo, login)
	if err != nil {
		return forge.PermissionNone, fmt.Errorf("permission of %s on %s/%s: %w", login, f.Name(), repo.FullName(), err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if len(c.entries) >= permCacheMax {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= permCacheMax {
			clear(c.entries)
		}
	}
	c.entries[k] = permEntry{perm: p, expires: now.Add(c.ttl)}
	return p, nil
}

// errNoPermission is the 403 of an action the user may not take.
var errNoPermission = httpapi.Errorf(http.StatusForbidden, "you may not do this: it needs write access to the repository, the pull request's authorship, or an admin")
