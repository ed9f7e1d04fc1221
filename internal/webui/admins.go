package webui

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/forge"
)

// The [auth] admins are written "forge:login", but a login is not an identity: its user can
// rename it, and someone else can then take it. Each entry is bound (admin_logins) to the
// forge user id that had the login when a frontend first resolved it, and names that user only
// while they still have the login:
//   - a renamed admin is no longer admin until the configuration names the new login;
//   - whoever takes the old login is not admin (their id is not the bound one);
//   - the binding is made at a frontend's first resolution of the entry after it starts, never
//     later (a frontend whose configuration lost an entry, restarted, deletes the binding; one
//     still running the old configuration must not bind the login to its new holder);
//   - the logins are looked up again every PermissionTTL, as permissions are; a forge that does
//     not answer keeps the entry's last answer, and is asked again sooner.

// adminRetry is how soon a resolution that failed for some entry is tried again.
const adminRetry = 30 * time.Second

// adminEntry is one "forge:login" of [auth] admins.
type adminEntry struct {
	forge, login string // login lower-case
	mayBind      bool   // not resolved yet since this process started: may create the binding
	userID       int64  // the bound user while they have the login; 0: nobody
}

// admins resolves the [auth] admins to forge user ids.
type admins struct {
	pool   *pgxpool.Pool
	forges forge.Set
	ttl    time.Duration
	log    *slog.Logger

	mu         sync.Mutex
	entries    []adminEntry
	next       time.Time // when to resolve again; zero: never resolved
	refreshing bool
	pruned     bool // bindings of entries not configured deleted
	resolved   chan struct{}
}

func newAdmins(pool *pgxpool.Pool, forges forge.Set, configured []string, ttl time.Duration, log *slog.Logger) *admins {
	a := &admins{pool: pool, forges: forges, ttl: ttl, log: log, resolved: make(chan struct{})}
	seen := map[string]bool{}
	for _, c := range configured {
		f, l, ok := strings.Cut(c, ":")
		key := f + ":" + strings.ToLower(l)
		if !ok || seen[key] {
			continue // config validation refuses malformed entries
		}
		seen[key] = true
		a.entries = append(a.entries, adminEntry{forge: f, login: strings.ToLower(l), mayBind: true})
	}
	return a
}

// is reports whether the forge's user userID is an admin. The first call waits for the first
// resolution (bounded by ctx); later ones use the last answer while it is refreshed.
func (a *admins) is(ctx context.Context, forgeName string, userID int64) bool {
	if a == nil || userID <= 0 || len(a.entries) == 0 {
		return false
	}
	a.refreshIfDue(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.entries {
		if e.forge == forgeName && e.userID == userID {
			return true
		}
	}
	return false
}

// refreshIfDue resolves the entries when they are due; only one caller does at a time. Before
// the first resolution, callers wait for it.
func (a *admins) refreshIfDue(ctx context.Context) {
	a.mu.Lock()
	first := a.next.IsZero()
	due := !a.refreshing && !time.Now().Before(a.next)
	if due {
		a.refreshing = true
	}
	resolved := a.resolved
	a.mu.Unlock()
	if due {
		// The resolution outlives a request that gives up: its answer serves the next one.
		go a.refresh(context.WithoutCancel(ctx))
	}
	if first {
		select {
		case <-resolved:
		case <-ctx.Done():
		}
	}
}

// refresh resolves every entry once and publishes the answers.
func (a *admins) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	a.mu.Lock()
	entries := append([]adminEntry(nil), a.entries...)
	prune := !a.pruned
	a.mu.Unlock()

	failed := false
	if prune {
		keys := make([]string, len(entries))
		for i, e := range entries {
			keys[i] = e.forge + ":" + e.login
		}
		if _, err := a.pool.Exec(ctx, sqlAdminUnbindOthers, keys); err != nil {
			a.log.Warn("admins: deleting the bindings of logins no longer configured failed", "error", err)
			failed, prune = true, false
		}
	}
	for i := range entries {
		id, err := a.resolve(ctx, &entries[i])
		if err != nil {
			failed = true
			a.log.Warn("admins: resolving an admin login failed; keeping its last answer", "admin", entries[i].forge+":"+entries[i].login, "error", err)
			continue
		}
		entries[i].userID, entries[i].mayBind = id, false
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	a.entries = entries
	a.pruned = a.pruned || prune
	wait := a.ttl
	if failed {
		wait = min(wait, adminRetry)
	}
	a.next = time.Now().Add(wait)
	a.refreshing = false
	select {
	case <-a.resolved:
	default:
		close(a.resolved)
	}
}

// resolve is the user id e names now: its bound user if that user has the login now, else 0.
func (a *admins) resolve(ctx context.Context, e *adminEntry) (int64, error) {
	f, ok := a.forges[e.forge]
	if !ok {
		return 0, nil // a forge no longer configured: nobody to ask
	}
	now, err := f.UserID(ctx, e.login)
	if errors.Is(err, forge.ErrNotFound) {
		now = 0 // nobody has the login now (renamed away)
	} else if err != nil {
		return 0, err
	}
	var bound int64
	err = a.pool.QueryRow(ctx, sqlAdminBound, e.forge, e.login).Scan(&bound)
	switch {
	case errors.Is(err, pgx.ErrNoRows) && e.mayBind && now > 0:
		// Another frontend may bind it first: its binding stands.
		if _, err := a.pool.Exec(ctx, sqlAdminBind, e.forge, e.login, now); err != nil {
			return 0, err
		}
		if err := a.pool.QueryRow(ctx, sqlAdminBound, e.forge, e.login).Scan(&bound); err != nil {
			return 0, err
		}
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil // bound by nobody yet, and too late for this process to bind it
	case err != nil:
		return 0, err
	}
	if now != bound {
		return 0, nil // renamed away, or the login's new holder
	}
	return bound, nil
}

// logins remembers which forge user id has a login, for PermissionTTL: the forges' permission
// APIs take a login, and a session's login (its user's when they logged in) may since have
// been renamed and taken by someone else, whose permissions are not the session's.
type logins struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[loginKey]loginEntry
}

type loginKey struct{ forge, login string }

type loginEntry struct {
	id      int64
	expires time.Time
}

func newLogins(ttl time.Duration) *logins {
	return &logins{ttl: ttl, now: time.Now, entries: map[loginKey]loginEntry{}}
}

// is reports whether login on f belongs to the user userID now. Errors are not remembered.
func (l *logins) is(ctx context.Context, f forge.Forge, login string, userID int64) (bool, error) {
	if userID <= 0 {
		return false, nil
	}
	k := loginKey{f.Name(), strings.ToLower(login)}
	l.mu.Lock()
	e, ok := l.entries[k]
	l.mu.Unlock()
	if !ok || !l.now().Before(e.expires) {
		id, err := f.UserID(ctx, login)
		if errors.Is(err, forge.ErrNotFound) {
			id, err = 0, nil
		}
		if err != nil {
			return false, err
		}
		e = loginEntry{id: id, expires: l.now().Add(l.ttl)}
		l.mu.Lock()
		if len(l.entries) >= permCacheMax {
			clear(l.entries)
		}
		l.entries[k] = e
		l.mu.Unlock()
	}
	return e.id == userID, nil
}
