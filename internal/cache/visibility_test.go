package cache_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
)

// Hash parts of the visibility fixture's paths.
const (
	privDrv   = "11111111111111111111111111111111" // private project a's derivation
	privOut   = "22222222222222222222222222222222" // its output
	pubDrv    = "33333333333333333333333333333333" // public project's
	pubOut    = "44444444444444444444444444444444"
	sharedDrv = "55555555555555555555555555555555" // private a's and the public project's
	sharedOut = "66666666666666666666666666666666"
	bDrv      = "77777777777777777777777777777777" // private project b's
	bOut      = "88888888888888888888888888888888"
	noneOut   = "99999999999999999999999999999999" // no project's
)

// visFixture inserts projects a and b (private) and pub (public) with their derivations and
// build jobs.
func visFixture(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, p := range []struct {
		name    string
		private bool
	}{{"a", true}, {"b", true}, {"pub", false}} {
		exec(`INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private) VALUES ('git', 'o', $1, 'o/'||$1, 'file:///'||$1, $2)`, p.name, p.private)
		exec(`INSERT INTO projects (repo_id, name) SELECT id, $1 FROM repositories WHERE name = $1`, p.name)
	}
	drv := func(project, drvHash, outHash string) {
		t.Helper()
		drvPath := "/nix/store/" + drvHash + "-p.drv"
		exec(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size) VALUES ($1, $2, 'p', 'x86_64-linux', 'h', 1) ON CONFLICT DO NOTHING`, drvPath, drvHash)
		exec(`INSERT INTO derivation_outputs (drv_path, output_name, output_path) VALUES ($1, 'out', $2) ON CONFLICT DO NOTHING`, drvPath, "/nix/store/"+outHash+"-p")
		exec(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch) SELECT id, 'f', $2, 'main' FROM projects WHERE name = $1`, project, drvHash)
		exec(`INSERT INTO eval_attrs (eval_id, attr, drv_path) SELECT max(id), 'x', $1 FROM evaluations`, drvPath)
	}
	drv("a", privDrv, privOut)
	drv("pub", pubDrv, pubOut)
	drv("a", sharedDrv, sharedOut)
	drv("pub", sharedDrv, sharedOut)
	drv("b", bDrv, bOut)
	exec(`INSERT INTO build_jobs (drv_path, project_id, system) SELECT '/nix/store/` + privDrv + `-p.drv', id, 'x86_64-linux' FROM projects WHERE name = 'a'`)
}

// A private project's narinfos (of outputs and of .drv files) and logs are read by the admin
// token, node tokens and live cache tokens of the project; anyone else gets exactly the answer
// of a path that does not exist. Public paths, and paths of no project, are everyone's.
func TestPrivatePathsNeedAToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	visFixture(t, pool)

	store := newLocal(t)
	for _, h := range []string{privDrv, privOut, pubOut, sharedOut, bOut, noneOut} {
		put(t, store, h+".narinfo", []byte("StorePath: /nix/store/"+h+"-p\n"))
	}
	put(t, store, "log/"+privDrv+"-p.drv", zstdCompress(t, []byte("private log\n")))
	put(t, store, "log/"+privDrv+"-p.drv.1", zstdCompress(t, []byte("private first attempt's log\n")))

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
	mint := func(projects []string, expires time.Time) (int64, string) {
		t.Helper()
		id, token, err := cache.MintToken(ctx, pool, projects, "test", expires)
		if err != nil {
			t.Fatal(err)
		}
		return id, token
	}
	later := time.Now().Add(time.Hour)
	_, aToken := mint([]string{"a"}, later)
	_, abToken := mint([]string{"b", "a"}, later)
	_, bToken := mint([]string{"b"}, later)
	_, expired := mint([]string{"a"}, time.Now().Add(-time.Minute))
	revokedID, revoked := mint([]string{"a"}, later)
	if err := cache.RevokeToken(ctx, pool, revokedID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cache.MintToken(ctx, pool, []string{"a", "nope"}, "", later); err == nil {
		t.Error("MintToken of a project that does not exist: no error")
	}

	for _, memory := range []int64{0, cache.DefaultNarinfoCacheBytes} {
		mux := http.NewServeMux()
		rt := access.NewRoutes(mux, nil)
		cache.New(cache.Config{Store: store, NarinfoCacheBytes: memory,
			Visibility: &cache.Visibility{DB: pool, Admin: &admin, Nodes: key}}).Register(rt)
		for _, r := range rt.List() {
			if r.Pattern != "GET /nix-cache-info" && r.Scope.Kind != access.KindStorePath {
				t.Errorf("%s declared %s, want %s", r.Pattern, r.Scope.Kind, access.KindStorePath)
			}
		}
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)

		type auth struct{ name, basic, bearer string }
		anonymous := auth{name: "anonymous"}
		callers := []struct {
			auth
			readsA bool
		}{
			{anonymous, false},
			{auth{"wrong token", "", "hcc1_wrong"}, false},
			{auth{"expired token", expired, ""}, false},
			{auth{"revoked token", revoked, ""}, false},
			{auth{"other project's token", bToken, ""}, false},
			{auth{"project's token (netrc)", aToken, ""}, true},
			{auth{"project's token (bearer)", "", aToken}, true},
			{auth{"token of two projects", abToken, ""}, true},
			{auth{"admin token", "", adminToken}, true},
			{auth{"node token", nodeToken, ""}, true},
			{auth{"forged node token", "hci1:builder-1:builder:AAAA", ""}, false},
		}
		get := func(path string, a auth, zstd bool) (int, string, http.Header) {
			t.Helper()
			req, err := http.NewRequest("GET", srv.URL+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if a.basic != "" {
				req.SetBasicAuth("anyone", a.basic)
			}
			if a.bearer != "" {
				req.Header.Set("Authorization", "Bearer "+a.bearer)
			}
			if zstd {
				req.Header.Set("Accept-Encoding", "zstd")
			}
			return send(t, srv, req)
		}
		private := []struct{ path, missing string }{
			{"/" + privOut + ".narinfo", "/" + miss32 + ".narinfo"},
			{"/" + privDrv + ".narinfo", "/" + miss32 + ".narinfo"},
			{"/log/" + privDrv + "-p.drv", "/log/" + miss32 + "-p.drv"},
			{"/log/" + privDrv + "-p.drv.1", "/log/" + miss32 + "-p.drv.1"},
		}
		for _, c := range callers {
			for _, p := range private {
				for _, zstd := range []bool{false, true} {
					code, body, h := get(p.path, c.auth, zstd)
					if c.readsA {
						if code != http.StatusOK || !strings.HasPrefix(h.Get("Cache-Control"), "private,") {
							t.Errorf("memory %d, %s: GET %s: %d %s (Cache-Control %q), want 200, private", memory, c.name, p.path, code, body, h.Get("Cache-Control"))
						}
						continue
					}
					mcode, mbody, mh := get(p.missing, c.auth, zstd)
					if code != http.StatusNotFound || code != mcode || body != mbody || !maps.EqualFunc(h, mh, slices.Equal) {
						t.Errorf("memory %d, %s: GET %s: %d %q %v; a missing path: %d %q %v", memory, c.name, p.path, code, body, h, mcode, mbody, mh)
					}
				}
			}
			// b's path: only b's tokens, the admin and nodes.
			code, _, _ := get("/"+bOut+".narinfo", c.auth, false)
			wantB := c.name == "other project's token" || c.name == "token of two projects" || c.name == "admin token" || c.name == "node token"
			if (code == http.StatusOK) != wantB {
				t.Errorf("memory %d, %s: GET b's narinfo: %d, want readable %v", memory, c.name, code, wantB)
			}
			// Public paths, shared ones and those of no project: everyone's.
			for _, h := range []string{pubOut, sharedOut, noneOut} {
				if code, body, hd := get("/"+h+".narinfo", c.auth, false); code != http.StatusOK || hd.Get("Cache-Control") != "public, max-age=60" {
					t.Errorf("memory %d, %s: GET public %s.narinfo: %d %s", memory, c.name, h, code, body)
				}
			}
		}
	}
}

// ListTokens lists what MintToken made, with its projects' names and revocation, and never the
// token.
func TestCacheTokenList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	visFixture(t, pool)
	id, token, err := cache.MintToken(ctx, pool, []string{"pub", "a"}, "ci", time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.RevokeToken(ctx, pool, id); err != nil {
		t.Fatal(err)
	}
	if err := cache.RevokeToken(ctx, pool, id); err == nil {
		t.Error("second revocation: no error")
	}
	list, err := cache.ListTokens(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != id || !slices.Equal(list[0].Projects, []string{"a", "pub"}) || list[0].RevokedAt == nil || list[0].Note != "ci" {
		t.Fatalf("ListTokens = %+v", list)
	}
	if token == "" {
		t.Fatal("empty token")
	}
}

// The public fast path: a narinfo answered from memory with visibility checks on, when no
// project is private (one query per TTL) and when one is (a path's projects looked up once
// per TTL), against no checks.
func BenchmarkNarinfoVisibility(b *testing.B) {
	pool := dbtest.NewPool(b)
	store := newLocalTB(b)
	put(b, store, pubOut+".narinfo", []byte("StorePath: /nix/store/"+pubOut+"-p\n"))
	for _, bc := range []struct {
		name    string
		vis     bool
		private bool
	}{{"off", false, false}, {"on, no private project", true, false}, {"on, private projects", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.private {
				pool := dbtest.NewPool(b) // a database of its own: b.Run may call this again
				visFixture(b, pool)
			}
			cfg := cache.Config{Store: store, NarinfoCacheBytes: cache.DefaultNarinfoCacheBytes}
			if bc.vis {
				cfg.Visibility = &cache.Visibility{DB: pool}
			}
			mux := http.NewServeMux()
			cache.New(cfg).Register(access.NewRoutes(mux, nil))
			req := httptest.NewRequest("GET", "/"+pubOut+".narinfo", nil)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				mux.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("%d %s", w.Code, w.Body)
				}
			}
		})
	}
}

// countingDB counts the queries Visibility makes.
type countingDB struct {
	db.DBTX
	n atomic.Int64
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n.Add(1)
	return c.DBTX.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.DBTX.QueryRow(ctx, sql, args...)
}

// The public fast path costs no query per request: with no private project, one query per TTL
// says so; with one, each path's projects are looked up once per TTL.
func TestVisibilityQueriesOncePerTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	clk := clock.NewManual(time.Now())
	req := httptest.NewRequest("GET", "/x", nil)
	read := func(v *cache.Visibility, hash string, times int) {
		t.Helper()
		for range times {
			if ok, private, err := v.MayRead(ctx, req, hash); err != nil || !ok || private {
				t.Fatalf("MayRead(%s) = %v, %v, %v; want public", hash, ok, private, err)
			}
		}
	}
	counted := &countingDB{DBTX: pool}
	v := &cache.Visibility{DB: counted, Clock: clk, TTL: 10 * time.Second}
	read(v, pubOut, 50)
	read(v, noneOut, 50)
	if n := counted.n.Load(); n != 1 {
		t.Errorf("no private project: %d queries for 100 reads, want 1", n)
	}
	clk.Advance(11 * time.Second)
	read(v, pubOut, 1)
	if n := counted.n.Load(); n != 2 {
		t.Errorf("after the TTL: %d queries, want 2", n)
	}

	visFixture(t, pool)
	counted = &countingDB{DBTX: pool}
	v = &cache.Visibility{DB: counted, Clock: clk, TTL: 10 * time.Second}
	read(v, pubOut, 50)
	read(v, sharedOut, 50)
	if n := counted.n.Load(); n != 3 {
		t.Errorf("private projects: %d queries for two paths read 50 times each, want 3", n)
	}
	if ok, private, err := v.MayRead(ctx, req, privOut); err != nil || ok || !private {
		t.Errorf("MayRead(private, anonymous) = %v, %v, %v; want false, true", ok, private, err)
	}
}

// A cache node without the cluster secret has node tokens checked elsewhere (a signer): a good
// one reads private paths, a forged one does not, each token is asked about once per TTL, and
// a check that cannot be made is an error, not a refusal the builder would take as final.
func TestNodeTokensCheckedElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	visFixture(t, pool)
	key, err := nodetoken.NewKey("cluster-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	good, err := key.Issue(nodetoken.Identity{NodeID: "builder-1", Roles: []string{"builder"}})
	if err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int64
	var down atomic.Bool
	clk := clock.NewManual(time.Now())
	v := &cache.Visibility{DB: pool, Clock: clk, TTL: 10 * time.Second,
		CheckNode: func(_ context.Context, token string) (bool, error) {
			asked.Add(1)
			if down.Load() {
				return false, errors.New("no signer answered")
			}
			_, err := key.Verify(token)
			return err == nil, nil
		}}
	with := func(token string) *http.Request {
		r := httptest.NewRequest("GET", "/x", nil)
		r.SetBasicAuth("builder", token)
		return r
	}
	cases := []struct {
		name  string
		token string
		reads bool
		asked int64 // CheckNode calls so far
	}{
		{"a good token", good, true, 1},
		{"the same token again", good, true, 1},
		{"a forged token", "hci1:builder-1:builder:AAAA", false, 2},
		{"the forged token again", "hci1:builder-1:builder:AAAA", false, 2},
		{"not a node token", "hcc1_other", false, 2},
	}
	for _, c := range cases {
		ok, private, err := v.MayRead(ctx, with(c.token), privOut)
		if err != nil || ok != c.reads || !private {
			t.Errorf("%s: MayRead = %v, %v, %v; want %v, private", c.name, ok, private, err, c.reads)
		}
		if n := asked.Load(); n != c.asked {
			t.Errorf("%s: CheckNode asked %d times, want %d", c.name, n, c.asked)
		}
	}
	clk.Advance(11 * time.Second)
	down.Store(true)
	if _, _, err := v.MayRead(ctx, with(good), privOut); err == nil {
		t.Error("MayRead with no signer to check the token: no error")
	}
	down.Store(false)

	// Random tokens, each new, cost at most the rate's burst of signer calls; then they are
	// turned away without a call until the budget refills, while a known token still reads.
	clk.Advance(time.Minute)
	before := asked.Load()
	if _, _, err := v.MayRead(ctx, with(good), privOut); err != nil {
		t.Fatalf("known token: %v", err)
	}
	var refused int
	for i := range 1000 {
		_, _, err := v.MayRead(ctx, with(fmt.Sprintf("hci1:builder-1:builder:%d", i)), privOut)
		if errors.Is(err, cache.ErrTooManyNodeChecks) {
			refused++
		} else if err != nil {
			t.Fatalf("random token %d: %v", i, err)
		}
	}
	burst := 5 * cache.DefaultCheckNodeRate
	if n := asked.Load() - before; n != int64(burst) || refused != 1000+1-burst {
		t.Errorf("1000 random tokens: %d signer calls and %d refused; want %d calls", n, refused, burst)
	}
	if ok, _, err := v.MayRead(ctx, with(good), privOut); !ok || err != nil {
		t.Errorf("known token past the budget: %v, %v", ok, err)
	}
	clk.Advance(time.Second)
	if _, _, err := v.MayRead(ctx, with("hci1:builder-1:builder:new"), privOut); err != nil {
		t.Errorf("a new token a second later: %v", err)
	}
}

// send sends req to srv and returns the answer's status, body and headers (without Date, so
// two answers compare equal).
func send(t *testing.T, srv *httptest.Server, req *http.Request) (int, string, http.Header) {
	t.Helper()
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
