package cache

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
)

// DefaultVisibilityTTL is how long Visibility keeps what it learnt of a path's projects and
// of whether any project is private.
const DefaultVisibilityTTL = 10 * time.Second

// maxPathEntries bounds the paths Visibility remembers; past it, it forgets them all.
const maxPathEntries = 200_000

// Visibility is who may read which store path. A path is private when every project that
// has it (a build job queued for it, an evaluation with it as an attribute) is private; a
// path of a public project, or of none, is everyone's. A private path is read by the admin
// token, by node tokens (when Nodes is set) and by cache tokens of one of its projects; to
// anyone else it is the same 404 as a path that does not exist. A quarantined output (its
// narinfo says so: only pull requests built it) is read likewise, by cache tokens of any of
// its projects, until a built row of it is released (MayReadQuarantined).
//
// Credentials are the password of HTTP basic auth (what Nix sends from a netrc-file; the
// user name is ignored) or a bearer token.
//
// What it learns is kept for TTL: whether any project is private at all (when none is, no
// path is looked up: the public fast path costs no query), and each path's projects.
type Visibility struct {
	DB db.DBTX
	// Admin, if set, is the admin token's hash: it reads everything.
	Admin *httpapi.TokenHash
	// Nodes, if set, verifies node tokens, which read everything (builders and evaluators).
	Nodes *nodetoken.Key
	// CheckNode, used when Nodes is nil, asks whether a node token is good (a signer, for a
	// cache node without the cluster secret). Its answers are kept for TTL.
	CheckNode func(ctx context.Context, token string) (bool, error)
	// CheckNodeRate bounds the CheckNode calls for tokens it has no answer for, per second,
	// with bursts of 5 s worth (default DefaultCheckNodeRate): a client sending random
	// "hci1:" tokens costs the signer no more than that. Past it, MayRead fails with
	// ErrTooManyNodeChecks, which the cache answers 503 with Retry-After (a builder retries).
	CheckNodeRate float64
	TTL           time.Duration // default DefaultVisibilityTTL
	Clock         clock.Clock   // default clock.Real

	mu         sync.Mutex
	anyPrivate bool
	anyAt      time.Time // zero: never asked
	paths      map[string]pathEntry
	nodes      map[[32]byte]nodeEntry // CheckNode's answers, by token hash
	// checkBudget is the CheckNode calls that may be made now, refilled at CheckNodeRate
	// from checkAt.
	checkBudget float64
	checkAt     time.Time
}

// DefaultCheckNodeRate is CheckNode calls per second for tokens without an answer kept.
const DefaultCheckNodeRate = 20

// ErrTooManyNodeChecks is MayRead's error past CheckNodeRate.
var ErrTooManyNodeChecks = errors.New("too many node tokens to check: try again shortly")

type nodeEntry struct {
	good bool
	at   time.Time
}

// maxNodeEntries bounds the remembered node-token answers (random tokens cost a signer call
// each and must not grow the map without end).
const maxNodeEntries = 10000

type pathEntry struct {
	private  bool
	projects []int64 // every project of the path
	// released: a built row of the output is not quarantined (never changes back).
	released bool
	at       time.Time
}

func (v *Visibility) ttl() time.Duration {
	if v.TTL > 0 {
		return v.TTL
	}
	return DefaultVisibilityTTL
}

func (v *Visibility) now() time.Time {
	if v.Clock == nil {
		return time.Now()
	}
	return v.Clock.Now()
}

// MayRead reports whether r may read the store paths of hash part hash, and whether they are
// private (an answer no shared cache may keep).
func (v *Visibility) MayRead(ctx context.Context, r *http.Request, hash string) (ok, private bool, err error) {
	if any, err := v.anyPrivateNow(ctx); err != nil || !any {
		return err == nil, false, err
	}
	e, err := v.path(ctx, hash)
	if err != nil || !e.private {
		return err == nil, false, err
	}
	ok, err = v.mayReadPrivate(ctx, r, e.projects)
	return ok, true, err
}

// MayReadQuarantined reports whether r may read the output of hash part hash, whose narinfo is
// marked quarantined: everyone once a built row of it is released (a trusted build, a
// promotion), else the readers of a private path. The mark is written with the narinfo, so a
// cache that learnt of the path before it was built never serves it to everyone.
// private says whether the answer is one no shared cache may keep.
func (v *Visibility) MayReadQuarantined(ctx context.Context, r *http.Request, hash string) (ok, private bool, err error) {
	e, err := v.path(ctx, hash)
	if err != nil {
		return false, false, err
	}
	if e.released {
		return true, false, nil
	}
	ok, err = v.mayReadPrivate(ctx, r, e.projects)
	return ok, true, err
}

// mayReadPrivate reports whether r's credentials read a path of projects.
func (v *Visibility) mayReadPrivate(ctx context.Context, r *http.Request, projects []int64) (bool, error) {
	token, ok := credential(r)
	if !ok {
		return false, nil
	}
	if v.Admin != nil && v.Admin.Matches(token) {
		return true, nil
	}
	if strings.HasPrefix(token, "hci1:") {
		switch {
		case v.Nodes != nil:
			_, err := v.Nodes.Verify(token)
			return err == nil, nil
		case v.CheckNode != nil:
			return v.checkNode(ctx, token)
		}
	}
	var ids []int64
	h := httpapi.HashToken(token)
	err := v.DB.QueryRow(ctx, sqlCacheTokenProjects, h[:]).Scan(&ids)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cache token: %w", err)
	}
	for _, id := range ids {
		if slices.Contains(projects, id) {
			return true, nil
		}
	}
	return false, nil
}

// anyPrivateNow reports whether any project is private, as learnt within the TTL.
func (v *Visibility) anyPrivateNow(ctx context.Context) (bool, error) {
	now := v.now()
	v.mu.Lock()
	if !v.anyAt.IsZero() && now.Sub(v.anyAt) < v.ttl() {
		any := v.anyPrivate
		v.mu.Unlock()
		return any, nil
	}
	v.mu.Unlock()
	var any bool
	if err := v.DB.QueryRow(ctx, sqlAnyPrivate).Scan(&any); err != nil {
		return false, fmt.Errorf("private projects: %w", err)
	}
	v.mu.Lock()
	v.anyPrivate, v.anyAt = any, now
	v.mu.Unlock()
	return any, nil
}

// path is what Visibility knows of the path hash: whether it is private, its projects, and
// whether it is a released output; looked up at most once per TTL.
func (v *Visibility) path(ctx context.Context, hash string) (pathEntry, error) {
	now := v.now()
	v.mu.Lock()
	if e, ok := v.paths[hash]; ok && now.Sub(e.at) < v.ttl() {
		v.mu.Unlock()
		return e, nil
	}
	v.mu.Unlock()

	rows, err := v.DB.Query(ctx, sqlPathProjects, hash)
	if err != nil {
		return pathEntry{}, fmt.Errorf("projects of %s: %w", hash, err)
	}
	var id *int64
	var private, released, public bool
	e := pathEntry{at: now}
	_, err = pgx.ForEachRow(rows, []any{&id, &private, &released}, func() error {
		e.released = released
		if id == nil {
			return nil
		}
		e.projects = append(e.projects, *id)
		if !private {
			public = true
		}
		return nil
	})
	if err != nil {
		return pathEntry{}, fmt.Errorf("projects of %s: %w", hash, err)
	}
	e.private = len(e.projects) > 0 && !public
	v.mu.Lock()
	if v.paths == nil || len(v.paths) >= maxPathEntries {
		v.paths = make(map[string]pathEntry)
	}
	v.paths[hash] = e
	v.mu.Unlock()
	return e, nil
}

// credential is the token of r: the password of basic auth, or a bearer token.
func credential(r *http.Request) (string, bool) {
	if _, password, ok := r.BasicAuth(); ok {
		return password, password != ""
	}
	return httpapi.BearerToken(r)
}

// NewToken returns a fresh random cache token.
func NewToken() (string, error) { return httpapi.NewToken(TokenPrefix) }

// TokenPrefix begins every cache token.
const TokenPrefix = "hcc1_"

// privateWriter marks a private path's answer private: no shared cache keeps it for others.
type privateWriter struct{ http.ResponseWriter }

func (p privateWriter) WriteHeader(code int) {
	h := p.Header()
	if cc, ok := strings.CutPrefix(h.Get("Cache-Control"), "public"); ok {
		h.Set("Cache-Control", "private"+cc)
	}
	p.ResponseWriter.WriteHeader(code)
}

func (p privateWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

// checkNode asks CheckNode about a node token, remembering the answer for TTL.
func (v *Visibility) checkNode(ctx context.Context, token string) (bool, error) {
	h := sha256.Sum256([]byte(token))
	now := v.now()
	v.mu.Lock()
	e, ok := v.nodes[h]
	if ok && now.Sub(e.at) < v.ttl() {
		v.mu.Unlock()
		return e.good, nil
	}
	if !v.takeCheck(now) {
		v.mu.Unlock()
		return false, ErrTooManyNodeChecks
	}
	v.mu.Unlock()
	good, err := v.CheckNode(ctx, token)
	if err != nil {
		return false, fmt.Errorf("check node token: %w", err)
	}
	v.mu.Lock()
	if v.nodes == nil || len(v.nodes) >= maxNodeEntries {
		v.nodes = map[[32]byte]nodeEntry{}
	}
	v.nodes[h] = nodeEntry{good: good, at: now}
	v.mu.Unlock()
	return good, nil
}

// takeCheck spends one CheckNode call of the budget, if there is one; v.mu is held.
func (v *Visibility) takeCheck(now time.Time) bool {
	rate := v.CheckNodeRate
	if rate <= 0 {
		rate = DefaultCheckNodeRate
	}
	burst := 5 * rate
	if v.checkAt.IsZero() {
		v.checkBudget = burst
	} else if d := now.Sub(v.checkAt); d > 0 {
		v.checkBudget = min(burst, v.checkBudget+d.Seconds()*rate)
	}
	v.checkAt = now
	if v.checkBudget < 1 {
		return false
	}
	v.checkBudget--
	return true
}
