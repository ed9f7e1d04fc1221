package upload

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signer"
	"github.com/harmonia-ci/harmonia-ci/internal/signertest"
)

// env is an in-process signer and binary cache (signertest) whose presigned uploads go through a
// counting server that fails the first failPuts with 500.
type env struct {
	pool     *pgxpool.Pool
	key      nix.SecretKey
	url      string // signer and cache
	client   *signer.Client
	puts     atomic.Int64 // PUTs that reached the upload server
	failPuts atomic.Int64 // PUTs still to fail
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{pool: dbtest.NewPool(t)}
	c := signertest.Start(t, e.pool, signertest.Options{KeyName: "upload-test-1", Uploads: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e.puts.Add(1)
			if e.failPuts.Add(-1) >= 0 {
				http.Error(w, "injected failure", http.StatusInternalServerError)
				return
			}
			h.ServeHTTP(w, r)
		})
	}})
	e.key, e.url, e.client = c.Key, c.URL, c.Client
	return e
}

func (e *env) publisher(t *testing.T) *Publisher {
	return &Publisher{Signer: e.client}
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	return queuetest.Ctx(t, 2*time.Minute)
}

func requireNix(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nix-store"); err != nil {
		t.Fatal("nix-store not found: install the Debian package nix-bin (scripts/deps.sh test does)")
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// addToStore adds a file or directory tree (relative path → content; a "->" prefix makes a
// symlink, a "+x" suffix on the name an executable) to the system store as name.
func addToStore(t *testing.T, name string, files map[string]string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), name)
	if content, ok := files[""]; ok {
		if err := os.WriteFile(root, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return run(t, "nix-store", "--add", root)
	}
	for rel, content := range files {
		mode := os.FileMode(0o644)
		if r, ok := strings.CutSuffix(rel, "+x"); ok {
			rel, mode = r, 0o755
		}
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	return run(t, "nix-store", "--add", root)
}

// fileReferring adds a text file to the store whose contents (and so references) name refs.
func fileReferring(t *testing.T, name string, refs ...string) string {
	t.Helper()
	var parts []string
	for _, r := range refs {
		parts = append(parts, fmt.Sprintf(`${builtins.storePath "%s"}`, r))
	}
	expr := fmt.Sprintf(`builtins.toFile "%s" "refers to %s\n"`, name, strings.Join(parts, " and "))
	out := run(t, "nix-instantiate", "--eval", "--read-write-mode", "--option", "substituters", "", "-E", expr)
	return strings.Trim(out, `"`)
}

// storePaths makes the paths every test publishes: a file, a tree with an executable, a
// symlink and a subdirectory, a file of more than 4 MiB (compressed through a temporary
// file), and a file that refers to two of them. The contents are fixed so reruns reuse the
// same store paths.
func storePaths(t *testing.T, tag string) []Path {
	t.Helper()
	rng := rand.New(rand.NewChaCha8([32]byte{'u', 'p', 'l', 'o', 'a', 'd'}))
	big := make([]byte, memLimit+512<<10)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	small := addToStore(t, "upload-test-"+tag+"-small", map[string]string{"": "a small file for " + tag + "\n"})
	tree := addToStore(t, "upload-test-"+tag+"-tree", map[string]string{
		"bin/hello+x":      "#!/bin/sh\necho hello " + tag + "\n",
		"share/doc/README": "a tree for " + tag + "\n",
		"share/link":       "->doc/README",
		"empty/.keep":      "",
	})
	bigPath := addToStore(t, "upload-test-"+tag+"-big", map[string]string{"": string(big)})
	ref := fileReferring(t, "upload-test-"+tag+"-ref", small, tree)
	paths := []Path{{StorePath: small}, {StorePath: tree}, {StorePath: bigPath}, {StorePath: ref}}
	for i := range paths {
		if refs := run(t, "nix-store", "-q", "--references", paths[i].StorePath); refs != "" {
			paths[i].References = strings.Fields(refs)
		}
	}
	if got := paths[3].References; !slices.Contains(got, small) || !slices.Contains(got, tree) {
		t.Fatalf("%s refers to %v, want %s and %s", ref, got, small, tree)
	}
	return paths
}

// pathInfo is what the system store says about a path.
type pathInfo struct {
	Path       string   `json:"path"`
	NarHash    string   `json:"narHash"` // SRI: sha256-<base64>
	NarSize    int64    `json:"narSize"`
	References []string `json:"references"`
}

func pathInfos(t *testing.T, paths []Path) map[string]pathInfo {
	t.Helper()
	args := []string{"--extra-experimental-features", "nix-command", "path-info", "--json"}
	for _, p := range paths {
		args = append(args, p.StorePath)
	}
	var infos []pathInfo
	if err := json.Unmarshal([]byte(run(t, "nix", args...)), &infos); err != nil {
		t.Fatal(err)
	}
	m := map[string]pathInfo{}
	for _, i := range infos {
		m[i.Path] = i
	}
	return m
}

func sriSHA256(t *testing.T, sri string) []byte {
	t.Helper()
	b64, ok := strings.CutPrefix(sri, "sha256-")
	if !ok {
		t.Fatalf("narHash %q is not sha256 SRI", sri)
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("narHash %q: %v", sri, err)
	}
	return b
}

// narinfo fetches and parses path's narinfo from the cache; nil when the cache answers 404.
func (e *env) narinfo(t *testing.T, path string) *nix.NarInfo {
	t.Helper()
	sp, err := nix.ParseStorePath(path)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(e.url + "/" + sp.Hash + ".narinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET narinfo of %s: %d %s", path, resp.StatusCode, body)
	}
	ni, err := nix.ParseNarInfo(body)
	if err != nil {
		t.Fatalf("narinfo of %s: %v\n%s", path, err, body)
	}
	return ni
}

// checkCache asserts every path's narinfo is in the cache, signed, with the store's NarHash,
// NarSize and references.
func (e *env) checkCache(t *testing.T, paths []Path) {
	t.Helper()
	infos := pathInfos(t, paths)
	for _, p := range paths {
		ni := e.narinfo(t, p.StorePath)
		if ni == nil {
			t.Fatalf("no narinfo for %s in the cache", p.StorePath)
		}
		want := infos[p.StorePath]
		sum, err := nix.ParseSHA256(ni.NarHash)
		if err != nil {
			t.Fatalf("narinfo of %s: %v", p.StorePath, err)
		}
		if !bytes.Equal(sum[:], sriSHA256(t, want.NarHash)) || ni.NarSize != want.NarSize {
			t.Errorf("%s: narinfo has NarHash %s NarSize %d, the store says %s and %d",
				p.StorePath, ni.NarHash, ni.NarSize, want.NarHash, want.NarSize)
		}
		var wantRefs []string
		for _, r := range want.References {
			wantRefs = append(wantRefs, filepath.Base(r))
		}
		slices.Sort(wantRefs)
		gotRefs := slices.Sorted(slices.Values(ni.References))
		if !slices.Equal(gotRefs, wantRefs) {
			t.Errorf("%s: narinfo references %v, want %v", p.StorePath, gotRefs, wantRefs)
		}
		if ni.StorePath != p.StorePath || ni.Compression != "zstd" || !ni.Verify(e.key.Public()) {
			t.Errorf("%s: narinfo for %s, compression %s, signature valid %v", p.StorePath, ni.StorePath, ni.Compression, ni.Verify(e.key.Public()))
		}
	}
}

// substitute fetches paths into a fresh chroot store from the cache, checking signatures.
func (e *env) substitute(t *testing.T, paths []Path) string {
	t.Helper()
	store := t.TempDir()
	args := []string{"--store", store, "-r"}
	for _, p := range paths {
		args = append(args, p.StorePath)
	}
	args = append(args, "--option", "substituters", e.url, "--option", "trusted-public-keys", e.key.Public().String(),
		"--option", "require-sigs", "true")
	if out, err := exec.Command("nix-store", args...).CombinedOutput(); err != nil {
		t.Fatalf("nix-store -r from the cache: %v\n%s", err, out)
	}
	return store
}

// TestPublishAndSubstitute publishes real store paths; Nix then substitutes every one of them
// from the cache, byte for byte, and a second publish finds nothing left to do.
func TestPublishAndSubstitute(t *testing.T) {
	requireNix(t)
	e := newEnv(t)
	paths := storePaths(t, "pub")
	// Parallel 2 and Batch 2: several upload-slots and build-complete rounds.
	pub := e.publisher(t)
	pub.Parallel, pub.Batch = 2, 2

	resp, err := pub.Publish(ctx(t), paths, Request{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Written != len(paths) || resp.Skipped != 0 || resp.Conflicts != 0 {
		t.Fatalf("first publish: %+v, want %d written", resp, len(paths))
	}
	if got := e.puts.Load(); got != int64(len(paths)) {
		t.Fatalf("first publish made %d PUTs, want %d", got, len(paths))
	}
	e.checkCache(t, paths)

	store := e.substitute(t, paths)
	for _, p := range paths {
		want := run(t, "nix-store", "--dump", p.StorePath)
		got := run(t, "nix-store", "--store", store, "--dump", p.StorePath)
		if got != want {
			t.Errorf("%s substituted with different contents", p.StorePath)
		}
	}

	// Everything is there: no upload, every narinfo skipped.
	putsBefore := e.puts.Load()
	resp, err = e.publisher(t).Publish(ctx(t), paths, Request{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Skipped != len(paths) || resp.Written != 0 || resp.Conflicts != 0 {
		t.Fatalf("second publish: %+v, want all %d skipped", resp, len(paths))
	}
	if got := e.puts.Load() - putsBefore; got != 0 {
		t.Fatalf("second publish made %d PUTs, want none", got)
	}
}

// TestPublishRetriesFailedUploads: a PUT that fails is retried with fresh slots, and only the
// failed one is retried; uploads that keep failing end in an error naming how many failed.
func TestPublishRetriesFailedUploads(t *testing.T) {
	requireNix(t)
	e := newEnv(t)
	paths := storePaths(t, "retry")

	e.failPuts.Store(1)
	resp, err := e.publisher(t).Publish(ctx(t), paths, Request{})
	if err != nil {
		t.Fatalf("publish with one failing PUT: %v", err)
	}
	if resp.Written != len(paths) {
		t.Fatalf("publish with one failing PUT: %+v, want %d written", resp, len(paths))
	}
	if got := e.puts.Load(); got != int64(len(paths))+1 {
		t.Fatalf("%d PUTs for %d paths and one failure, want %d", got, len(paths), len(paths)+1)
	}
	e.checkCache(t, paths)

	// A fresh path whose uploads always fail: three rounds, then an error, and nothing published.
	fresh := []Path{{StorePath: addToStore(t, "upload-test-retry-doomed", map[string]string{"": "never uploaded\n"})}}
	if ni := e.narinfo(t, fresh[0].StorePath); ni != nil {
		t.Fatalf("%s is in the cache before it was published", fresh[0].StorePath)
	}
	e.failPuts.Store(1 << 30)
	before := e.puts.Load()
	_, err = e.publisher(t).Publish(ctx(t), fresh, Request{})
	if err == nil || !strings.Contains(err.Error(), "1 uploads failed") || !strings.Contains(err.Error(), "500") {
		t.Fatalf("publish whose uploads all fail = %v, want an error saying 1 upload failed with 500", err)
	}
	if got := e.puts.Load() - before; got != 3 {
		t.Fatalf("%d PUTs for an upload that always fails, want 3 (one per round)", got)
	}
	if ni := e.narinfo(t, fresh[0].StorePath); ni != nil {
		t.Fatalf("%s was published although its upload failed", fresh[0].StorePath)
	}
}

// TestCacheLookup is the signer's POST /api/cache-lookup through the client.
func TestCacheLookup(t *testing.T) {
	requireNix(t)
	e := newEnv(t)
	paths := storePaths(t, "lookup")
	published, unpublished := paths[:2], paths[2:]
	if _, err := e.publisher(t).Publish(ctx(t), published, Request{}); err != nil {
		t.Fatal(err)
	}
	absent := "/nix/store/" + queuetest.Hash("never-built") + "-never-built"

	var ask []string
	for _, p := range paths {
		ask = append(ask, p.StorePath)
	}
	ask = append(ask, absent)
	got, err := e.client.CacheLookup(ctx(t), ask)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{published[0].StorePath, published[1].StorePath}
	if !slices.Equal(got, want) {
		t.Fatalf("CacheLookup = %v, want %v (not %v nor %s)", got, want, unpublished, absent)
	}
	if got, err := e.client.CacheLookup(ctx(t), nil); err != nil || len(got) != 0 {
		t.Fatalf("CacheLookup of nothing = %v, %v; want empty", got, err)
	}

	// At most MaxLookup paths: a request with one more is refused as a whole.
	many := make([]string, 0, signer.MaxLookup+1)
	for i := range signer.MaxLookup {
		many = append(many, "/nix/store/"+queuetest.Hash(fmt.Sprint("many-", i))+"-many")
	}
	many[0] = published[0].StorePath
	if got, err := e.client.CacheLookup(ctx(t), many); err != nil || !slices.Equal(got, many[:1]) {
		t.Fatalf("CacheLookup of MaxLookup paths = %v, %v; want just %s", got, err, many[0])
	}
	many = append(many, absent)
	var se *signer.StatusError
	if _, err := e.client.CacheLookup(ctx(t), many); !errors.As(err, &se) || se.Code != http.StatusBadRequest ||
		!strings.Contains(se.Msg, fmt.Sprint(signer.MaxLookup)) {
		t.Fatalf("CacheLookup of %d paths = %v, want a 400 naming the limit", len(many), err)
	}
	if _, err := e.client.CacheLookup(ctx(t), []string{"/nix/store/not-a-store-path"}); !errors.As(err, &se) || se.Code != http.StatusBadRequest {
		t.Fatalf("CacheLookup of an invalid path = %v, want a 400", err)
	}

	// Without the cluster token, or with another one: 401, whatever is asked.
	body, _ := json.Marshal(signer.CacheLookupRequest{StorePaths: []string{published[0].StorePath}})
	for _, auth := range []string{"", "Bearer wrong-token", signertest.Token} {
		req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, e.url+"/api/cache-lookup", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || bytes.Contains(msg, []byte(published[0].StorePath)) {
			t.Fatalf("cache-lookup with Authorization %q: %d %s, want 401 without an answer", auth, resp.StatusCode, msg)
		}
	}
}

// TestPublishBuildWithLog: a build's outputs and its log go up together; build-complete marks
// the job succeeded with its log_url, and the cache serves the log.
func TestPublishBuildWithLog(t *testing.T) {
	requireNix(t)
	e := newEnv(t)
	paths := storePaths(t, "build")[:1]
	queuetest.Enqueue(t, e.pool, nil, queuetest.Drv("logged", "x86_64-linux"))
	jobs, err := queue.ClaimJobs(ctx(t), e.pool, queue.Claimer{NodeID: "builder-1", Systems: []string{"x86_64-linux"}}, 1)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claim: %v, %d jobs", err, len(jobs))
	}
	job := jobs[0]
	key := "log/" + filepath.Base(job.DrvPath)
	text := strings.Repeat("building logged\n", 1000)
	_, err = e.publisher(t).PublishWithLog(ctx(t), paths, &Log{Key: key, Data: []byte(text)},
		Request{JobID: &job.ID, NodeID: job.NodeID, Attempt: job.Attempt})
	if err != nil {
		t.Fatal(err)
	}
	var status, logURL string
	if err := e.pool.QueryRow(ctx(t), `SELECT status, COALESCE(log_url, '') FROM build_jobs WHERE id = $1`, job.ID).Scan(&status, &logURL); err != nil {
		t.Fatal(err)
	}
	if status != "succeeded" || logURL != key {
		t.Fatalf("job %s with log_url %q, want succeeded with %q", status, logURL, key)
	}
	resp, err := http.Get(e.url + "/" + key)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != text {
		t.Fatalf("GET /%s: %s, %d bytes; want the log (%d bytes)", key, resp.Status, len(body), len(text))
	}
}
