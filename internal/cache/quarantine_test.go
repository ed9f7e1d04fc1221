package cache_test

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
)

// Hash parts of the quarantine fixture's paths, all of public projects.
const (
	qDrv      = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" // a pull request's derivation
	qOut      = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" // its output, built only for the pull request
	qTrustOut = "cccccccccccccccccccccccccccccccc" // built for a pull request and for a branch
	qLateDrv  = "ffffffffffffffffffffffffffffffff" // a pull request's, built after the cache asked
	qLateOut  = "gggggggggggggggggggggggggggggggg"
)

// quarantinedNarinfo is a narinfo as the signer writes it for an untrusted job.
func quarantinedNarinfo(hash string) []byte {
	return []byte("StorePath: /nix/store/" + hash + "-q\nHarmoniaQuarantined: 1\n")
}

// quarFixture inserts the public projects pub and other, pub's derivations with a job each, and
// outputs built for a pull request only (qOut) and for both (qTrustOut).
func quarFixture(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, name := range []string{"pub", "other"} {
		exec(`INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private) VALUES ('git', 'o', $1, 'o/'||$1, 'file:///'||$1, false)`, name)
		exec(`INSERT INTO projects (repo_id, name) SELECT id, $1 FROM repositories WHERE name = $1`, name)
	}
	drv := func(drvHash, outHash string, quarantined bool) {
		t.Helper()
		drvPath := "/nix/store/" + drvHash + "-q.drv"
		exec(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size) VALUES ($1, $2, 'q', 'x86_64-linux', 'h', 1)`, drvPath, drvHash)
		exec(`INSERT INTO derivation_outputs (drv_path, output_name, output_path, nar_hash, nar_size, quarantined) VALUES ($1, 'out', $2, 'sha256:x', 1, $3)`,
			drvPath, "/nix/store/"+outHash+"-q", quarantined)
		exec(`INSERT INTO build_jobs (drv_path, project_id, system, status, trusted) SELECT $1, id, 'x86_64-linux', 'succeeded', $2 FROM projects WHERE name = 'pub'`,
			drvPath, !quarantined)
	}
	drv(qDrv, qOut, true)
	// Two derivations of one output path (equal derivation hashes): one built for a pull
	// request, one for a branch.
	drv("dddddddddddddddddddddddddddddddd", qTrustOut, true)
	drv("eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", qTrustOut, false)
}

// An output built only for a pull request is quarantined even in a public project: anonymous
// cache users get exactly the answer of a missing path (GET and HEAD); nodes, the admin and the
// project's tokens read it, privately. Its .drv and an output a trusted job built too are
// public. Once promoted it is everyone's.
func TestQuarantinedOutputsOfAPublicProject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	quarFixture(t, pool)

	store := newLocal(t)
	put(t, store, qDrv+".narinfo", []byte("StorePath: /nix/store/"+qDrv+"-q\n"))
	// Both outputs were first built for a pull request; one has been built by a trusted job too.
	put(t, store, qOut+".narinfo", quarantinedNarinfo(qOut))
	put(t, store, qTrustOut+".narinfo", quarantinedNarinfo(qTrustOut))
	const adminToken = "admin-token-0123456789"
	admin := httpapi.HashToken(adminToken)
	key, err := nodetoken.NewKey("cluster-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	nodeToken, err := key.Issue(nodetoken.Identity{NodeID: "builder-1", Roles: []string{"builder"}})
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	_, pubToken, err := cache.MintToken(ctx, pool, []string{"pub"}, "", later)
	if err != nil {
		t.Fatal(err)
	}
	_, otherToken, err := cache.MintToken(ctx, pool, []string{"other"}, "", later)
	if err != nil {
		t.Fatal(err)
	}

	serve := func() *httptest.Server {
		mux := http.NewServeMux()
		rt := access.NewRoutes(mux, nil)
		cache.New(cache.Config{Store: store, NarinfoCacheBytes: cache.DefaultNarinfoCacheBytes,
			Visibility: &cache.Visibility{DB: pool, Admin: &admin, Nodes: key}}).Register(rt)
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv
	}
	getMethod := func(srv *httptest.Server, method, path, token string) (int, string, http.Header) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.SetBasicAuth("anyone", token)
		}
		return send(t, srv, req)
	}
	get := func(srv *httptest.Server, path, token string) (int, string, http.Header) {
		t.Helper()
		return getMethod(srv, http.MethodGet, path, token)
	}

	srv := serve()
	// A pull request's output built after the cache learnt its path (and that nothing is
	// private) is not served to everyone meanwhile: the narinfo carries the mark.
	if code, _, _ := get(srv, "/"+qLateOut+".narinfo", ""); code != http.StatusNotFound {
		t.Fatalf("a path not built yet: %d", code)
	}
	for _, sql := range []string{
		`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size) VALUES ('/nix/store/` + qLateDrv + `-q.drv', '` + qLateDrv + `', 'q', 'x86_64-linux', 'h', 1)`,
		`INSERT INTO derivation_outputs (drv_path, output_name, output_path, nar_hash, nar_size, quarantined) VALUES ('/nix/store/` + qLateDrv + `-q.drv', 'out', '/nix/store/` + qLateOut + `-q', 'sha256:x', 1, true)`,
		`INSERT INTO build_jobs (drv_path, project_id, system, status, trusted) SELECT '/nix/store/` + qLateDrv + `-q.drv', id, 'x86_64-linux', 'succeeded', false FROM projects WHERE name = 'pub'`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	put(t, store, qLateOut+".narinfo", quarantinedNarinfo(qLateOut))
	for range 2 { // from the store, then from memory
		if code, _, _ := get(srv, "/"+qLateOut+".narinfo", ""); code != http.StatusNotFound {
			t.Errorf("a pull request's output built after the cache asked about it, anonymous: %d, want 404", code)
		}
	}
	if code, _, _ := get(srv, "/"+qLateOut+".narinfo", nodeToken); code != http.StatusOK {
		t.Errorf("a pull request's output built after the cache asked about it, node token: %d, want 200", code)
	}

	for _, c := range []struct {
		name, token string
		reads       bool
	}{
		{"anonymous", "", false},
		{"another project's token", otherToken, false},
		{"the project's token", pubToken, true},
		{"admin token", adminToken, true},
		{"node token", nodeToken, true},
	} {
		for _, head := range []bool{false, true} {
			code, _, _ := getMethod(srv, map[bool]string{false: http.MethodGet, true: http.MethodHead}[head], "/"+qOut+".narinfo", c.token)
			if (code == http.StatusOK) != c.reads {
				t.Errorf("%s: HEAD %v of the quarantined output: %d, want readable %v", c.name, head, code, c.reads)
			}
		}
		code, body, h := get(srv, "/"+qOut+".narinfo", c.token)
		if c.reads {
			if code != http.StatusOK || !strings.HasPrefix(h.Get("Cache-Control"), "private,") {
				t.Errorf("%s: GET the quarantined output: %d %s (Cache-Control %q), want 200, private", c.name, code, body, h.Get("Cache-Control"))
			}
		} else {
			mcode, mbody, mh := get(srv, "/"+miss32+".narinfo", c.token)
			if code != http.StatusNotFound || code != mcode || body != mbody || !maps.EqualFunc(h, mh, slices.Equal) {
				t.Errorf("%s: GET the quarantined output: %d %q %v; a missing path: %d %q %v", c.name, code, body, h, mcode, mbody, mh)
			}
		}
		for _, p := range []string{qDrv, qTrustOut} {
			if code, body, h := get(srv, "/"+p+".narinfo", c.token); code != http.StatusOK || h.Get("Cache-Control") != "public, max-age=60" {
				t.Errorf("%s: GET public %s.narinfo: %d %s (Cache-Control %q)", c.name, p, code, body, h.Get("Cache-Control"))
			}
		}
	}

	// Promotion: the same narinfo, everyone's.
	if _, err := pool.Exec(ctx, `UPDATE derivation_outputs SET quarantined = false`); err != nil {
		t.Fatal(err)
	}
	srv = serve()
	if code, body, h := get(srv, "/"+qOut+".narinfo", ""); code != http.StatusOK || h.Get("Cache-Control") != "public, max-age=60" {
		t.Errorf("promoted output, anonymous: %d %s (Cache-Control %q), want 200, public", code, body, h.Get("Cache-Control"))
	}
}
