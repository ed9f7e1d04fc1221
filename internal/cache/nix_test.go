package cache_test

import (
	"bytes"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

// tryNix runs a Nix command offline (nixtest.Offline).
func tryNix(t *testing.T, bin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return nixtest.Offline(t, bin, args...)
}

func runNix(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, stderr, err := tryNix(t, bin, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderr)
	}
	return out
}

func writeFile(t *testing.T, path, data string, perm fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}

func TestRealNixSubstitutes(t *testing.T) {
	src := filepath.Join(t.TempDir(), "harmonia-cache-e2e")
	writeFile(t, filepath.Join(src, "hello.txt"), "hello from the cache\n", 0o644)
	writeFile(t, filepath.Join(src, "bin", "run"), "#!/bin/sh\necho hi\n", 0o755)
	writeFile(t, filepath.Join(src, "deep", "er", "leaf"), strings.Repeat("leaf ", 10000), 0o644)
	path := runNix(t, "nix-store", "--add", src)
	// A real derivation file, never built: its basename names the log.
	drv := runNix(t, "nix-instantiate", "--read-write-mode", "-E",
		`derivation { name = "harmonia-cache-log"; system = "x86_64-linux"; builder = "/bin/sh"; args = ["-c" "echo hi"]; }`)
	if !strings.HasSuffix(drv, ".drv") {
		t.Fatalf("nix-instantiate printed %q, want a .drv path", drv)
	}

	key, err := nix.GenerateKey("harmonia-cache-e2e-1")
	if err != nil {
		t.Fatal(err)
	}
	store := newLocal(t)
	blobtest.PublishPath(t, store, key, path)
	const buildLog = "configuring\nbuilding harmonia-cache-log\nhi\n"
	put(t, store, "log/"+filepath.Base(drv), zstdCompress(t, []byte(buildLog)))

	mux := http.NewServeMux()
	cache.New(cache.Config{Store: store}).Register(access.NewRoutes(mux, nil))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	chroot := nixtest.WritableTempDir(t)
	_, stderr, err := tryNix(t, "nix-store", "--store", chroot, "-r", path,
		"--option", "substituters", srv.URL,
		"--option", "trusted-public-keys", key.Public().String(),
		"--option", "require-sigs", "true")
	if err != nil {
		t.Fatalf("nix-store -r from the cache failed: %v\n%s", err, stderr)
	}
	got, _, err := nix.HashNAR(filepath.Join(chroot, path))
	if err != nil {
		t.Fatalf("substituted path missing: %v", err)
	}
	if want, _, _ := nix.HashNAR(path); got != want {
		t.Errorf("%s substituted with NAR hash %s, want %s", path, got, want)
	}

	// A key Nix does not trust: the same cache must be refused.
	other, err := nix.GenerateKey("harmonia-cache-e2e-2")
	if err != nil {
		t.Fatal(err)
	}
	_, stderr, err = tryNix(t, "nix-store", "--store", nixtest.WritableTempDir(t), "-r", path,
		"--option", "substituters", srv.URL,
		"--option", "trusted-public-keys", other.Public().String(),
		"--option", "require-sigs", "true")
	// Nix 2.8: "… is not signed by any of the keys"; 2.26: "… as it's not signed by any of the keys".
	if err == nil || !strings.Contains(stderr, "not signed by any of the keys") {
		t.Errorf("nix-store -r with an untrusted key: err %v, want a signature failure\n%s", err, stderr)
	}

	// The build log, as a plain HTTP client (curl) reads it.
	resp, err := http.Get(srv.URL + "/log/" + filepath.Base(drv))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || body.String() != buildLog {
		t.Errorf("GET /log/%s: %d %q, want 200 %q", filepath.Base(drv), resp.StatusCode, body.String(), buildLog)
	}
}
