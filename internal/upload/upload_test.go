package upload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
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
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
	"github.com/harmonia-ci/harmonia-ci/internal/signertest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

const (
	system = "x86_64-linux"
	node   = "worker-1" // the node the tests' client speaks for: builder and evaluator
)

// env is an in-process signer and binary cache (signertest) whose presigned uploads go through a
// counting server that fails the first failPuts with 500.
type env struct {
	pool     *pgxpool.Pool
	cluster  *signertest.Cluster
	key      nix.SecretKey
	url      string // signer and cache
	client   *signerclient.Client
	puts     atomic.Int64 // PUTs that reached the upload server
	failPuts atomic.Int64 // PUTs still to fail
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{pool: dbtest.NewPool(t)}
	e.cluster = signertest.Start(t, e.pool, signertest.Options{KeyName: "upload-test-1", Uploads: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e.puts.Add(1)
			if e.failPuts.Add(-1) >= 0 {
				http.Error(w, "injected failure", http.StatusInternalServerError)
				return
			}
			h.ServeHTTP(w, r)
		})
	}})
	e.key, e.url, e.client = e.cluster.Key, e.cluster.URL, e.cluster.Client(t, node)
	queuetest.InsertNode(t, e.pool, queuetest.Node{ID: node, Roles: []string{"builder", "evaluator"}, Systems: []string{system}})
	return e
}

func (e *env) publisher() *Publisher { return &Publisher{Signer: e.client} }

func ctx(t *testing.T) context.Context {
	t.Helper()
	return queuetest.Ctx(t, 2*time.Minute)
}

// fixedJob enqueues a fixed-output derivation whose output is the store path out (added to the
// store with no references, so a recursive sha256 of its NAR gives it), with input sources
// srcs, its .drv in the cache as an evaluation publishes it; it claims the job as the test's
// node and returns the claim and the .drv path.
func (e *env) fixedJob(t *testing.T, out string, srcs ...string) (queue.Claim, string) {
	t.Helper()
	sp, err := nix.ParseStorePath(out)
	if err != nil {
		t.Fatal(err)
	}
	narHash, _, err := nix.HashNAR(out)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := nix.ParseSHA256(narHash)
	if err != nil {
		t.Fatal(err)
	}
	d := queuetest.MakeDrv(queuetest.DrvSpec{Name: sp.Name, System: system, Srcs: srcs, FixedNAR: &sum})
	if d.Out("out") != out {
		t.Fatalf("the fixed-output derivation of %s has output %s", out, d.Out("out"))
	}
	e.cluster.Enqueue(t, nil, d)
	return e.claim(t, d.DrvPath), d.DrvPath
}

// claim claims the one ready job, of the derivation at drv, as the test's node.
func (e *env) claim(t *testing.T, drv string) queue.Claim {
	t.Helper()
	jobs, err := queue.ClaimJobs(ctx(t), e.pool, queue.Claimer{NodeID: node, Systems: []string{system}}, 1)
	if err != nil || len(jobs) != 1 || jobs[0].DrvPath != drv {
		t.Fatalf("claim %s: %v, %v", drv, jobs, err)
	}
	return jobs[0].Claim()
}

// evaluation inserts a running evaluation claimed by the test's node and returns its claim.
func (e *env) evaluation(t *testing.T, name string) signerapi.EvalClaim {
	t.Helper()
	project := queuetest.NewProject(t, e.pool, name, 100)
	id := queuetest.QueryInt(t, e.pool, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at, attempt)
VALUES ($1, 'git+file:///src', 'c0ffee', 'main', 'running', $2, now(), now(), 3) RETURNING id`, project, node)
	return signerapi.EvalClaim{ID: id, Attempt: 3}
}

func (e *env) jobRow(t *testing.T, id int64) (st status.JobStatus, logURL string) {
	t.Helper()
	if err := e.pool.QueryRow(ctx(t), `SELECT status, COALESCE(log_url, '') FROM build_jobs WHERE id = $1`, id).Scan(&st, &logURL); err != nil {
		t.Fatal(err)
	}
	return st, logURL
}

func requireNix(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"nix-store", "nix", "nix-instantiate"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: install the Debian package nix-bin (scripts/deps.sh test does)", bin)
		}
	}
}

// run runs a Nix command offline, with a narinfo disk cache of the test's own, and returns its
// trimmed standard output.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	args = append([]string{"--option", "substituters", "", "--option", "build-users-group", ""}, args...)
	if name == "nix" {
		args = append([]string{"--extra-experimental-features", "nix-command"}, args...)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir(), "NIX_REMOTE=")
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
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	return run(t, "nix-store", "--add", root)
}

// fileReferring adds a text file to the store (builtins.toFile) whose contents, and so
// references, name refs.
func fileReferring(t *testing.T, name string, refs ...string) string {
	t.Helper()
	var parts []string
	for _, r := range refs {
		parts = append(parts, fmt.Sprintf(`${builtins.storePath "%s"}`, r))
	}
	expr := fmt.Sprintf(`builtins.toFile "%s" "refers to %s\n"`, name, strings.Join(parts, " and "))
	return strings.Trim(run(t, "nix-instantiate", "--eval", "--read-write-mode", "-E", expr), `"`)
}

func references(t *testing.T, path string) []string {
	t.Helper()
	return strings.Fields(run(t, "nix-store", "-q", "--references", path))
}

// storePaths makes real store paths: a file, a tree with an executable, a symlink and a
// subdirectory, a file of more than 4 MiB (compressed through a temporary file), and a file
// that refers to the first two. The contents are fixed so reruns reuse the same store paths.
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
		paths[i].References = references(t, paths[i].StorePath)
	}
	if got := paths[3].References; !slices.Contains(got, small) || !slices.Contains(got, tree) {
		t.Fatalf("%s refers to %v, want %s and %s", ref, got, small, tree)
	}
	return paths
}

// built is a real build's outputs: two derivations (a and b) that Nix treats as one (each
// takes its own fixed-output derivation of one hash), with outputs "out" (a tree with an
// executable, a symlink and a subdirectory), "big" (a file of more than 4 MiB, compressed
// through a temporary file) and "ref" (a file referring to an input source and to "out").
type built struct {
	paths []Path   // the input source, then out, big and ref
	drvs  []string // a and b
}

// buildOutputs instantiates and builds (with Nix, unsandboxed, into the system store) the
// derivations of built for tag. The contents are fixed so reruns reuse the same store paths.
func buildOutputs(t *testing.T, tag string) built {
	t.Helper()
	rng := rand.New(rand.NewChaCha8([32]byte{'u', 'p', 'l', 'o', 'a', 'd'}))
	big := make([]byte, memLimit+512<<10)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	small := addToStore(t, "upload-test-"+tag+"-small", map[string]string{"": "a small file for " + tag + "\n"})
	bigSrc := addToStore(t, "upload-test-"+tag+"-big-src", map[string]string{"": string(big)})
	bigSum := sha256.Sum256(big)
	expr := fmt.Sprintf(`
let
  small = builtins.storePath %[1]q;
  bigSrc = builtins.storePath %[2]q;
  data = mirror: derivation {
    name = "upload-test-%[3]s-data"; system = %[4]q; builder = "/bin/sh"; inherit mirror;
    args = [ "-c" "/bin/cp ${bigSrc} $out" ];
    outputHashMode = "flat"; outputHashAlgo = "sha256"; outputHash = %[5]q;
  };
  job = mirror: derivation {
    name = "upload-test-%[3]s"; system = %[4]q; builder = "/bin/sh"; outputs = [ "out" "big" "ref" ];
    args = [ "-c" ''
      /bin/mkdir -p $out/bin $out/share/doc $out/empty
      echo '#!/bin/sh' > $out/bin/hello
      echo 'echo hello %[3]s' >> $out/bin/hello
      /bin/chmod +x $out/bin/hello
      echo 'a tree for %[3]s' > $out/share/doc/README
      /bin/ln -s doc/README $out/share/link
      : > $out/empty/.keep
      /bin/cp ${data mirror} $big
      echo "refers to ${small} and $out" > $ref
    '' ];
  };
in { a = job "a"; b = job "b"; }`, small, bigSrc, tag, system, hex.EncodeToString(bigSum[:]))
	file := filepath.Join(t.TempDir(), "default.nix")
	if err := os.WriteFile(file, []byte(expr), 0o644); err != nil {
		t.Fatal(err)
	}
	drvs := strings.Fields(run(t, "nix-instantiate", file, "-A", "a", "-A", "b"))
	if len(drvs) != 2 || drvs[0] == drvs[1] {
		t.Fatalf("nix-instantiate printed %v, want two .drv files", drvs)
	}
	var outs []string
	for _, line := range strings.Fields(run(t, "nix-store", "--option", "sandbox", "false", "-r", drvs[0], drvs[1])) {
		if !slices.Contains(outs, line) {
			outs = append(outs, line)
		}
	}
	d, err := nix.ReadDerivation("", drvs[0])
	if err != nil {
		t.Fatal(err)
	}
	b := built{drvs: drvs, paths: []Path{{StorePath: small}}}
	for _, o := range []string{"out", "big", "ref"} {
		if !slices.Contains(outs, d.Outputs[o].Path) {
			t.Fatalf("building %v gave %v, not %s's output %s", drvs, outs, o, d.Outputs[o].Path)
		}
		b.paths = append(b.paths, Path{StorePath: d.Outputs[o].Path})
	}
	if len(outs) != 3 {
		t.Fatalf("building two derivations Nix treats as one gave %v, want their three outputs", outs)
	}
	for i := range b.paths {
		b.paths[i].References = references(t, b.paths[i].StorePath)
	}
	if got := b.paths[3].References; !slices.Contains(got, small) || !slices.Contains(got, b.paths[1].StorePath) {
		t.Fatalf("ref refers to %v, want %s and %s", got, small, b.paths[1].StorePath)
	}
	return b
}

// buildJob claims the job of b's derivation drvs[i], its .drv closure in the cache and its input
// source paths[0] too (an evaluator published them). It returns the outputs to publish,
// paths[1:], with the job's .drv as deriver as the builder passes it.
func (e *env) buildJob(t *testing.T, b built, i int) (queue.Claim, string, []Path) {
	t.Helper()
	drv := b.drvs[i]
	seed := []signertest.SeedPath{{StorePath: b.paths[0].StorePath, References: b.paths[0].References}}
	for _, p := range strings.Fields(run(t, "nix-store", "-q", "--requisites", drv)) {
		if strings.HasSuffix(p, ".drv") {
			seed = append(seed, signertest.SeedPath{StorePath: p})
		}
	}
	e.cluster.Seed(t, "", seed...)
	d, err := nix.ReadDerivation("", drv)
	if err != nil {
		t.Fatal(err)
	}
	narHash, narSize, err := nix.HashNAR(drv)
	if err != nil {
		t.Fatal(err)
	}
	q := queue.Derivation{DrvPath: drv, Name: d.Name(), System: d.Platform, NarHash: narHash, NarSize: narSize, InputSrcs: d.InputSrcs}
	for _, name := range d.OutputNames() {
		q.Outputs = append(q.Outputs, queue.Output{Name: name, Path: d.Outputs[name].Path})
	}
	for _, in := range slices.Sorted(maps.Keys(d.InputDrvs)) {
		q.Inputs = append(q.Inputs, queue.Input{DrvPath: in, Outputs: d.InputDrvs[in]})
	}
	if _, err := queue.Enqueue(ctx(t), e.pool, queue.EnqueueParams{Derivations: []queue.Derivation{q}}); err != nil {
		t.Fatal(err)
	}
	outs := slices.Clone(b.paths[1:])
	for i := range outs {
		outs[i].Deriver = drv
	}
	return e.claim(t, drv), drv, outs
}

// pathInfos is what the system store says about paths.
func pathInfos(t *testing.T, paths []Path) map[string]nixtest.PathInfo {
	t.Helper()
	var args []string
	for _, p := range paths {
		args = append(args, p.StorePath)
	}
	return nixtest.PathInfos(t, nil, args...)
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
// NarSize, references and content address, and the path's deriver.
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
		if nix.FormatSHA256(sum) != want.NarHash || ni.NarSize != want.NarSize {
			t.Errorf("%s: narinfo has NarHash %s NarSize %d, the store says %s and %d",
				p.StorePath, ni.NarHash, ni.NarSize, want.NarHash, want.NarSize)
		}
		var wantRefs []string
		for _, r := range want.References {
			wantRefs = append(wantRefs, filepath.Base(r))
		}
		slices.Sort(wantRefs)
		if got := slices.Sorted(slices.Values(ni.References)); !slices.Equal(got, wantRefs) {
			t.Errorf("%s: narinfo references %v, want %v", p.StorePath, got, wantRefs)
		}
		if ni.StorePath != p.StorePath || ni.Compression != "zstd" || !ni.Verify(e.key.Public()) {
			t.Errorf("%s: narinfo for %s, compression %s, signature valid %v", p.StorePath, ni.StorePath, ni.Compression, ni.Verify(e.key.Public()))
		}
		if wantDeriver := filepath.Base(p.Deriver); p.Deriver != "" && ni.Deriver != wantDeriver {
			t.Errorf("%s: narinfo deriver %q, want %q", p.StorePath, ni.Deriver, wantDeriver)
		}
	}
}

// substitute fetches paths into a fresh chroot store from the cache, checking signatures, and
// checks that each is the system store's byte for byte.
func (e *env) substitute(t *testing.T, paths []Path) {
	t.Helper()
	store := t.TempDir()
	args := []string{"--store", store, "-r"}
	for _, p := range paths {
		args = append(args, p.StorePath)
	}
	args = append(args, "--option", "substituters", e.url, "--option", "trusted-public-keys", e.key.Public().String(),
		"--option", "require-sigs", "true")
	run(t, "nix-store", args...)
	for _, p := range paths {
		want := run(t, "nix-store", "--dump", p.StorePath)
		if got := run(t, "nix-store", "--store", store, "--dump", p.StorePath); got != want {
			t.Errorf("%s substituted with different contents", p.StorePath)
		}
	}
}

// TestPublishBuildAndSubstitute publishes a build's real outputs under its job's claim; Nix then
// substitutes every one of them, and the input they refer to, from the cache with signatures
// required. An equivalent job later finds nothing left to upload.
func TestPublishBuildAndSubstitute(t *testing.T) {
	t.Parallel()
	requireNix(t)
	e := newEnv(t)
	b := buildOutputs(t, "pub")
	paths := b.paths
	claim, _, outs := e.buildJob(t, b, 0)
	pub := e.publisher()
	pub.Parallel = 2

	resp, err := publishBuild(ctx(t), pub, claim, outs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp != (Response{Written: len(outs)}) {
		t.Fatalf("publish: %+v, want %d written", resp, len(outs))
	}
	if got := e.puts.Load(); got != int64(len(outs)) {
		t.Fatalf("publish made %d PUTs, want %d", got, len(outs))
	}
	if st, _ := e.jobRow(t, claim.JobID); st != status.JobSucceeded {
		t.Fatalf("the job is %s, want succeeded", st)
	}
	e.checkCache(t, paths)
	e.substitute(t, paths)

	// An equivalent derivation (same outputs: Nix treats the two as one) built again: no
	// upload, every narinfo skipped.
	putsBefore := e.puts.Load()
	again, _, outs2 := e.buildJob(t, b, 1)
	resp, err = publishBuild(ctx(t), e.publisher(), again, outs2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp != (Response{Skipped: len(outs)}) {
		t.Fatalf("second publish: %+v, want all %d skipped", resp, len(outs))
	}
	if got := e.puts.Load() - putsBefore; got != 0 {
		t.Fatalf("second publish made %d PUTs, want none", got)
	}

	// A finished job's claim publishes nothing more.
	var se *signerclient.StatusError
	if _, err := publishBuild(ctx(t), e.publisher(), claim, outs, nil); !errors.As(err, &se) || se.Code != http.StatusConflict {
		t.Fatalf("publish under a finished claim = %v, want a 409", err)
	}
}

// evalClosure instantiates a real project with Nix: a derivation using a source directory, a
// builtins.toFile script referring to it, a flat fixed-output file and another derivation. It
// returns the .drv files of the closure, inputs first, and the sources.
func evalClosure(t *testing.T, tag string) (drvs []string, sources []Path) {
	t.Helper()
	src := addToStore(t, "upload-test-"+tag+"-src", map[string]string{"README": "sources of " + tag + "\n", "build.sh+x": "echo " + tag + "\n"})
	dir := t.TempDir()
	flatFile := filepath.Join(dir, "upload-test-"+tag+"-flat")
	if err := os.WriteFile(flatFile, []byte("a flat file for "+tag+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	flat := run(t, "nix-store", "--add-fixed", "sha256", flatFile)
	expr := fmt.Sprintf(`
let
  src = builtins.storePath %q;
  flat = builtins.storePath %q;
  script = builtins.toFile "upload-test-%s-script" "cat ${src}/README\n";
  dep = derivation { name = "upload-test-%s-dep"; system = %q; builder = "/bin/sh"; args = [ "-c" "echo ${flat} > $out" ]; };
in derivation {
  name = "upload-test-%s-app"; system = %q; builder = "/bin/sh";
  args = [ "-c" ". ${script}; echo ${dep} > $out" ];
}`, src, flat, tag, tag, system, tag, system)
	app := run(t, "nix-instantiate", "-E", expr)
	// The closure of the .drv, ordered so that every path comes after its references.
	refs := map[string][]string{}
	for _, p := range strings.Fields(run(t, "nix-store", "-q", "--requisites", app)) {
		refs[p] = references(t, p)
	}
	done := map[string]bool{}
	var visit func(p string)
	visit = func(p string) {
		if done[p] {
			return
		}
		done[p] = true
		for _, r := range refs[p] {
			if r != p {
				visit(r)
			}
		}
		if strings.HasSuffix(p, ".drv") {
			drvs = append(drvs, p)
		} else {
			sources = append(sources, Path{StorePath: p, References: refs[p]})
		}
	}
	visit(app)
	if len(drvs) != 2 || len(sources) != 3 {
		t.Fatalf("closure of %s: .drv files %v, sources %v; want 2 and 3", app, drvs, sources)
	}
	return drvs, sources
}

// TestPublishEval publishes an evaluation's real .drv closure and sources under its claim. The
// cache then describes them as Nix does (content addresses included), and Nix copies the .drv
// closure from it with signatures required, as a builder does.
func TestPublishEval(t *testing.T) {
	t.Parallel()
	requireNix(t)
	e := newEnv(t)
	drvs, sources := evalClosure(t, "eval")
	claim := e.evaluation(t, "eval")
	pub := e.publisher()
	// A request per path: each may refer only to what earlier ones published. The sources come
	// referrers first (the script before the source it names); the publisher reorders them.
	pub.Batch = 1
	referrersFirst := slices.Clone(sources)
	slices.Reverse(referrersFirst)

	resp, err := pub.PublishEval(ctx(t), claim, drvs, referrersFirst)
	if err != nil {
		t.Fatal(err)
	}
	if resp != (Response{Written: len(drvs) + len(sources)}) {
		t.Fatalf("publish: %+v, want %d written", resp, len(drvs)+len(sources))
	}
	if got := e.puts.Load(); got != int64(len(sources)) {
		t.Fatalf("publish made %d PUTs, want one per source (%d): the signer writes .drv files itself", got, len(sources))
	}
	all := slices.Clone(sources)
	for _, d := range drvs {
		all = append(all, Path{StorePath: d})
	}
	e.checkCache(t, sources)
	infos := pathInfos(t, sources)
	for _, d := range drvs {
		infos[d] = nixtest.PathInfos(t, nil, "--derivation", d)[d]
	}
	if len(infos) != len(all) {
		t.Fatalf("Nix describes %d paths, want %d", len(infos), len(all))
	}
	for _, info := range infos {
		ni := e.narinfo(t, info.Path)
		if ni == nil || ni.CA != info.CA || info.CA == "" || !ni.Verify(e.key.Public()) ||
			ni.NarHash != info.NarHash || len(ni.References) != len(info.References) {
			t.Errorf("%s: the cache has %+v, Nix says %+v", info.Path, ni, info)
		}
	}

	// A builder's first step: the .drv closure, copied from the cache into an empty store.
	store := t.TempDir()
	app := drvs[len(drvs)-1]
	run(t, "nix", "copy", "--derivation", "--from", e.url, "--store", store,
		"--option", "substituters", e.url, "--option", "trusted-public-keys", e.key.Public().String(),
		"--option", "require-sigs", "true", app)
	for _, p := range all {
		if got, want := run(t, "nix-store", "--store", store, "--dump", p.StorePath), run(t, "nix-store", "--dump", p.StorePath); got != want {
			t.Errorf("%s copied with different contents", p.StorePath)
		}
	}

	// A retried evaluation: nothing to upload, everything skipped.
	putsBefore := e.puts.Load()
	resp, err = e.publisher().PublishEval(ctx(t), claim, drvs, sources)
	if err != nil {
		t.Fatal(err)
	}
	if resp != (Response{Skipped: len(drvs) + len(sources)}) || e.puts.Load() != putsBefore {
		t.Fatalf("second publish: %+v with %d PUTs, want all skipped without PUTs", resp, e.puts.Load()-putsBefore)
	}

	// Another attempt's claim (the evaluation was reclaimed) publishes nothing.
	stale := claim
	stale.Attempt--
	var se *signerclient.StatusError
	if _, err := e.publisher().PublishEval(ctx(t), stale, drvs, sources); !errors.As(err, &se) || se.Code != http.StatusConflict {
		t.Fatalf("publish under a stale claim = %v, want a 409", err)
	}
}

// TestPublishRetriesFailedUploads: a PUT that fails is retried with fresh slots, and only the
// failed one is retried; uploads that keep failing end in an error naming how many failed, and
// nothing is published.
func TestPublishRetriesFailedUploads(t *testing.T) {
	t.Parallel()
	requireNix(t)
	e := newEnv(t)
	b := buildOutputs(t, "retry")
	paths := b.paths
	claim, _, outs := e.buildJob(t, b, 0)

	e.failPuts.Store(1)
	resp, err := publishBuild(ctx(t), e.publisher(), claim, outs, nil)
	if err != nil {
		t.Fatalf("publish with one failing PUT: %v", err)
	}
	if resp.Written != len(outs) {
		t.Fatalf("publish with one failing PUT: %+v, want %d written", resp, len(outs))
	}
	if got := e.puts.Load(); got != int64(len(outs))+1 {
		t.Fatalf("%d PUTs for %d paths and one failure, want %d", got, len(outs), len(outs)+1)
	}
	e.checkCache(t, paths)

	// A fresh output whose uploads always fail: three rounds, then an error, and nothing
	// published; the job is left to the worker.
	doomed := Path{StorePath: addToStore(t, "upload-test-retry-doomed", map[string]string{"": "never uploaded\n"})}
	dclaim, _ := e.fixedJob(t, doomed.StorePath)
	e.failPuts.Store(1 << 30)
	before := e.puts.Load()
	_, err = publishBuild(ctx(t), e.publisher(), dclaim, []Path{doomed}, nil)
	if err == nil || !strings.Contains(err.Error(), "1 uploads failed") || !strings.Contains(err.Error(), "500") {
		t.Fatalf("publish whose uploads all fail = %v, want an error saying 1 upload failed with 500", err)
	}
	if got := e.puts.Load() - before; got != 3 {
		t.Fatalf("%d PUTs for an upload that always fails, want 3 (one per round)", got)
	}
	if ni := e.narinfo(t, doomed.StorePath); ni != nil {
		t.Fatalf("%s was published although its upload failed", doomed.StorePath)
	}
	if st, _ := e.jobRow(t, dclaim.JobID); st != status.JobBuilding {
		t.Fatalf("the job is %s, want building", st)
	}
}

// TestCacheLookup is the signer's POST /api/cache-lookup through the client.
func TestCacheLookup(t *testing.T) {
	t.Parallel()
	requireNix(t)
	e := newEnv(t)
	paths := storePaths(t, "lookup")
	// paths[0] is seeded as the job's input; the job publishes out (paths[1]) only.
	e.cluster.Seed(t, "", signertest.SeedPath{StorePath: paths[0].StorePath})
	claim, _ := e.fixedJob(t, paths[1].StorePath, paths[0].StorePath)
	if _, err := publishBuild(ctx(t), e.publisher(), claim, paths[1:2], nil); err != nil {
		t.Fatal(err)
	}
	published, unpublished := paths[:2], paths[2:]
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
	many := make([]string, 0, signerapi.MaxLookup+1)
	for i := range signerapi.MaxLookup {
		many = append(many, "/nix/store/"+queuetest.Hash(fmt.Sprint("many-", i))+"-many")
	}
	many[0] = published[0].StorePath
	if got, err := e.client.CacheLookup(ctx(t), many); err != nil || !slices.Equal(got, many[:1]) {
		t.Fatalf("CacheLookup of MaxLookup paths = %v, %v; want just %s", got, err, many[0])
	}
	many = append(many, absent)
	var se *signerclient.StatusError
	if _, err := e.client.CacheLookup(ctx(t), many); !errors.As(err, &se) || se.Code != http.StatusBadRequest ||
		!strings.Contains(se.Msg, fmt.Sprint(signerapi.MaxLookup)) {
		t.Fatalf("CacheLookup of %d paths = %v, want a 400 naming the limit", len(many), err)
	}
	if _, err := e.client.CacheLookup(ctx(t), []string{"/nix/store/not-a-store-path"}); !errors.As(err, &se) || se.Code != http.StatusBadRequest {
		t.Fatalf("CacheLookup of an invalid path = %v, want a 400", err)
	}

	// Any node of the cluster may ask (a cache-only node too); nobody else learns anything.
	if got, err := e.cluster.Client(t, "cache-1", "cache").CacheLookup(ctx(t), ask[:1]); err != nil || len(got) != 1 {
		t.Fatalf("CacheLookup by a cache node = %v, %v", got, err)
	}
	otherCluster, err := nodetoken.NewKey("another-cluster-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := otherCluster.Issue(nodetoken.Identity{NodeID: node, Roles: []string{"builder", "evaluator"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(signerapi.CacheLookupRequest{StorePaths: []string{published[0].StorePath}})
	for _, auth := range []string{"", "Bearer wrong-token", "Bearer " + signertest.Secret, "Bearer " + foreign} {
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
// the job succeeded with its log_url, and the cache serves the log. A failed build uploads its
// log alone, and only its own.
func TestPublishBuildWithLog(t *testing.T) {
	t.Parallel()
	requireNix(t)
	e := newEnv(t)
	paths := storePaths(t, "build")
	claim, drv := e.fixedJob(t, paths[1].StorePath)
	key := "log/" + filepath.Base(drv)
	text := strings.Repeat("building logged\n", 1000)
	if _, err := publishBuild(ctx(t), e.publisher(), claim, paths[1:2], &Log{Key: key, Data: []byte(text)}); err != nil {
		t.Fatal(err)
	}
	if st, logURL := e.jobRow(t, claim.JobID); st != status.JobSucceeded || logURL != key {
		t.Fatalf("job %s with log_url %q, want succeeded with %q", st, logURL, key)
	}
	e.checkLog(t, key, text)

	// A failed build: its log alone.
	fclaim, fdrv := e.fixedJob(t, paths[2].StorePath)
	fkey := "log/" + filepath.Base(fdrv)
	if err := e.publisher().UploadLog(ctx(t), fclaim, Log{Key: fkey, Data: []byte("error: it failed\n")}); err != nil {
		t.Fatal(err)
	}
	e.checkLog(t, fkey, "error: it failed\n")
	if st, _ := e.jobRow(t, fclaim.JobID); st != status.JobBuilding {
		t.Fatalf("the failed job is %s after its log upload, want building (the worker records the failure)", st)
	}
	if ni := e.narinfo(t, paths[2].StorePath); ni != nil {
		t.Fatal("a log upload published an output")
	}
	// Its claim does not reach another job's log.
	var se *signerclient.StatusError
	if err := e.publisher().UploadLog(ctx(t), fclaim, Log{Key: key, Data: []byte("overwritten")}); !errors.As(err, &se) || se.Code != http.StatusBadRequest {
		t.Fatalf("upload of another job's log = %v, want a 400", err)
	}
	e.checkLog(t, key, text)
}

func (e *env) checkLog(t *testing.T, key, want string) {
	t.Helper()
	resp, err := http.Get(e.url + "/" + key)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != want {
		t.Fatalf("GET /%s: %s, %d bytes; want the log (%d bytes)", key, resp.Status, len(body), len(want))
	}
}

// publishBuild publishes outputs and log under job as a builder does: prepare, then send.
func publishBuild(ctx context.Context, p *Publisher, job queue.Claim, paths []Path, log *Log) (Response, error) {
	b, err := p.PrepareBuild(ctx, paths)
	if err != nil {
		return Response{}, err
	}
	defer b.Close()
	return p.SendBuild(ctx, job, b, log)
}
