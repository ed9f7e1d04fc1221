package cache_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

// A private project's output, substituted by the real Nix client with require-sigs: refused
// without credentials (and with another project's token), substituted with a netrc-file whose
// password is a cache token of the project.
func TestRealNixPrivatePath(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	visFixture(t, pool)

	src := filepath.Join(t.TempDir(), "harmonia-cache-private")
	writeFile(t, filepath.Join(src, "secret.txt"), "a private project's output\n", 0o644)
	path := runNix(t, "nix-store", "--add", src)
	const drvHash = "abababababababababababababababab"
	drvPath := "/nix/store/" + drvHash + "-private.drv"
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size) VALUES ($1, $2, 'private', 'x86_64-linux', 'h', 1)`, []any{drvPath, drvHash}},
		{`INSERT INTO derivation_outputs (drv_path, output_name, output_path) VALUES ($1, 'out', $2)`, []any{drvPath, path}},
		{`INSERT INTO build_jobs (drv_path, project_id, system) SELECT $1, id, 'x86_64-linux' FROM projects WHERE name = 'a'`, []any{drvPath}},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	later := time.Now().Add(time.Hour)
	_, aToken, err := cache.MintToken(ctx, pool, []string{"a"}, "", later)
	if err != nil {
		t.Fatal(err)
	}
	_, bToken, err := cache.MintToken(ctx, pool, []string{"b"}, "", later)
	if err != nil {
		t.Fatal(err)
	}

	key, err := nix.GenerateKey("harmonia-cache-private-1")
	if err != nil {
		t.Fatal(err)
	}
	store := newLocal(t)
	blobtest.PublishPath(t, store, key, path)
	mux := http.NewServeMux()
	cache.New(cache.Config{Store: store, NarinfoCacheBytes: cache.DefaultNarinfoCacheBytes,
		Visibility: &cache.Visibility{DB: pool}}).Register(access.NewRoutes(mux, nil))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	netrc := func(token string) string {
		f := filepath.Join(t.TempDir(), "netrc")
		writeFile(t, f, "machine "+u.Hostname()+" login nix password "+token+"\n", 0o600)
		return f
	}

	for _, c := range []struct {
		name  string
		netrc string
		ok    bool
	}{
		{"no credentials", "", false},
		{"another project's token", netrc(bToken), false},
		{"the project's token", netrc(aToken), true},
	} {
		chroot := nixtest.WritableTempDir(t)
		args := []string{"--store", chroot, "-r", path,
			"--option", "substituters", srv.URL,
			"--option", "trusted-public-keys", key.Public().String(),
			"--option", "require-sigs", "true"}
		if c.netrc != "" {
			args = append(args, "--option", "netrc-file", c.netrc)
		}
		_, stderr, err := tryNix(t, "nix-store", args...)
		if !c.ok {
			// The cache answered 404, as for a path it does not have: Nix finds no substitute.
			if err == nil || !strings.Contains(stderr, "don't know how to build") {
				t.Errorf("%s: nix-store -r of a private path: err %v, want no substitute\n%s", c.name, err, stderr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: nix-store -r failed: %v\n%s", c.name, err, stderr)
		}
		got, _, err := nix.HashNAR(filepath.Join(chroot, path))
		if err != nil {
			t.Fatalf("%s: substituted path missing: %v", c.name, err)
		}
		if want, _, _ := nix.HashNAR(path); got != want {
			t.Errorf("%s: %s substituted with NAR hash %s, want %s", c.name, path, got, want)
		}
	}
}
