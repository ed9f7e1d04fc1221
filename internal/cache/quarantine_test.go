package cache_test

import (
	"context"
	"io"
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
)

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
// cache users get exactly the answer of a missing path; nodes, the admin and the project's
// tokens read it, privately. Its .drv and an output a trusted job built too are public. Once
// promoted it is everyone's.
func TestQuarantinedOutputsOfAPublicProject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	quarFixture(t, pool)

	store := newLocal(t)
	for _, h := range []string{qDrv, qOut, qTrustOut} {
		put(t, store, h+".narinfo", []byte("StorePath: /nix/store/"+h+"-q\n"))
	}
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
	get := func(srv *httptest.Server, path, token string) (int, string, http.Header) {
		t.Helper()
		req, err := http.NewRequest("GET", srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.SetBasicAuth("anyone", token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		resp.Header.Del("Date")
		return resp.StatusCode, string(body), resp.Header
	}

	srv := serve()
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
