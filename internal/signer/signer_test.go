package signer

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
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func TestMain(m *testing.M) { dbtest.Main(m, blobtest.Cleanup) }

const (
	secret = "signer-test-cluster-secret"
	system = "x86_64-linux"
)

// env is a signer on a real database and a real blob store (a local directory, or MinIO),
// served over HTTP; the local store's presigned uploads go to the same server.
type env struct {
	pool     *pgxpool.Pool
	store    blob.Store
	key      nix.SecretKey
	tokens   *nodetoken.Key
	upstream *fakeUpstream
	url      string // signer base URL
	reg      *prometheus.Registry
}

func newEnv(t *testing.T, s3 bool) *env {
	t.Helper()
	return newEnvOn(t, s3, dbtest.NewPool(t))
}

// newEnvOn is newEnv with the signer on pool.
func newEnvOn(t *testing.T, s3 bool, pool *pgxpool.Pool) *env {
	t.Helper()
	key, err := nix.GenerateKey("test-cache-1")
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := nodetoken.NewKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	logger := queuetest.TestLogger(t)
	mux := http.NewServeMux()
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	var store blob.Store
	if s3 {
		st, err := blob.NewS3(blobtest.StartMinIO(t))
		if err != nil {
			t.Fatal(err)
		}
		store = st
	} else {
		l, err := blob.NewLocal(t.TempDir(), ts.URL, nodetoken.Derive(secret, "blob upload"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		mux.Handle("PUT /api/blob/{key...}", l.UploadHandler(logger))
		store = l
	}
	up := &fakeUpstream{key: mustKey(t, "upstream-1"), paths: map[string]*nix.NarInfo{}}
	reg := prometheus.NewRegistry()
	srv, err := New(Config{Store: store, Key: key, Tokens: tokens, Upstream: up, Logger: logger, Registerer: reg}, pool)
	if err != nil {
		t.Fatal(err)
	}
	srv.Register(access.NewRoutes(mux, nil))
	return &env{pool: pool, store: store, key: key, tokens: tokens, upstream: up, url: ts.URL, reg: reg}
}

func mustKey(t *testing.T, name string) nix.SecretKey {
	t.Helper()
	k, err := nix.GenerateKey(name)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// fakeUpstream is a trusted upstream cache that serves the narinfos put in it.
type fakeUpstream struct {
	key   nix.SecretKey
	mu    sync.Mutex
	paths map[string]*nix.NarInfo
	asked atomic.Int64
}

func (u *fakeUpstream) NarInfo(_ context.Context, path string) (*nix.NarInfo, error) {
	u.asked.Add(1)
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.paths[path], nil
}

func (u *fakeUpstream) serve(t *testing.T, o object) {
	t.Helper()
	ni := nix.NewNarInfo(o.out.StorePath, o.sizes(), bases(o.out.References))
	if err := ni.Sign(u.key); err != nil {
		t.Fatal(err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.paths[o.out.StorePath] = ni
}

func ctx(t *testing.T) context.Context { return queuetest.Ctx(t, 30*time.Second) }

// token is node's token in roles under the test cluster's secret.
func (e *env) token(t *testing.T, node string, roles ...string) string {
	t.Helper()
	tok, err := e.tokens.Issue(nodetoken.Identity{NodeID: node, Roles: roles})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (e *env) builder(t *testing.T, node string) string {
	return e.token(t, node, config.RoleBuilder)
}

func (e *env) evaluator(t *testing.T, node string) string {
	return e.token(t, node, config.RoleEvaluator)
}

// post sends body (JSON, or raw bytes) with token ("" for none) and decodes a 200 answer into
// out; it returns the status and the body.
func (e *env) post(t *testing.T, path, token string, body, out any) (int, string) {
	t.Helper()
	data, ok := body.([]byte)
	if !ok {
		var err error
		if data, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, e.url+path, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("decode %s answer %s: %v", path, raw, err)
		}
	}
	return res.StatusCode, string(raw)
}

// mustPost is post for requests that must succeed.
func (e *env) mustPost(t *testing.T, path, token string, body, out any) {
	t.Helper()
	if code, raw := e.post(t, path, token, body, out); code != http.StatusOK {
		t.Fatalf("%s: %d %s", path, code, raw)
	}
}

// object is a store object a test makes up: what a request says about it and its compressed
// NAR.
type object struct {
	out  signerapi.Output
	file []byte // the .nar.zst
}

func (o object) path() string { return o.out.StorePath }
func (o object) base() string { return strings.TrimPrefix(o.out.StorePath, nix.StoreDir+"/") }

func (o object) sizes() nix.Sizes {
	return nix.Sizes{NarHash: o.out.NarHash, NarSize: o.out.NarSize, FileHash: o.out.FileHash, FileSize: o.out.FileSize}
}

func (o object) narSum(t *testing.T) [sha256.Size]byte {
	t.Helper()
	sum, err := nix.ParseSHA256(o.out.NarHash)
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// with returns o as a request describes it with refs and deriver.
func (o object) with(refs []string, deriver string) object {
	o.out.References = slices.Clone(refs)
	if o.out.References == nil {
		o.out.References = []string{}
	}
	o.out.Deriver = deriver
	return o
}

// nar serialises files (relative path → contents; "" is a single regular file, a "+x" suffix
// makes an executable) as a compressed NAR.
func nar(t *testing.T, files map[string]string) (nix.Sizes, []byte) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "obj")
	for rel, content := range files {
		p, mode := filepath.Join(root, rel), os.FileMode(0o644)
		if r, ok := strings.CutSuffix(rel, "+x"); ok {
			p, mode = filepath.Join(root, r), 0o755
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		// WriteFile's mode is filtered by the umask; the NAR depends on the x bits.
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	sz, err := nix.CompressNAR(context.Background(), root, &buf)
	if err != nil {
		t.Fatal(err)
	}
	return sz, buf.Bytes()
}

func newObject(path string, sz nix.Sizes, file []byte, refs ...string) object {
	if refs == nil {
		refs = []string{}
	}
	return object{out: signerapi.Output{StorePath: path, NarHash: sz.NarHash, NarSize: sz.NarSize,
		FileHash: sz.FileHash, FileSize: sz.FileSize, References: refs}, file: file}
}

// built is a tree claimed to be the store path path (input-addressed: nothing ties the path to
// the content) with refs.
func built(t *testing.T, path, content string, refs ...string) object {
	t.Helper()
	sz, file := nar(t, map[string]string{"bin/hello+x": content, "share/refs": strings.Join(refs, "\n")})
	return newObject(path, sz, file, refs...)
}

// source is a directory added to the store as a source (recursive, content-addressed).
func source(t *testing.T, name, content string) object {
	t.Helper()
	sz, file := nar(t, map[string]string{"README": content, "bin/tool+x": "#!/bin/sh\n" + content})
	o := newObject("", sz, file)
	o.out.StorePath = nix.SourcePath(name, o.narSum(t), nil, false)
	return o
}

// textFile is a file added to the store as builtins.toFile does (text, content-addressed),
// referring to refs.
func textFile(t *testing.T, name, content string, refs ...string) object {
	t.Helper()
	sz, file := nar(t, map[string]string{"": content})
	return newObject(nix.TextPath(name, sha256.Sum256([]byte(content)), refs), sz, file, refs...)
}

// flatFile is a file added with a fixed flat sha256 (builtins.path with recursive = false).
func flatFile(t *testing.T, name, content string) object {
	t.Helper()
	sz, file := nar(t, map[string]string{"": content})
	return newObject(nix.FlatFixedPath(name, sha256.Sum256([]byte(content))), sz, file)
}

func fakePath(key, name string) string { return nix.StoreDir + "/" + queuetest.Hash(key) + "-" + name }

func bases(paths []string) []string {
	b := make([]string, len(paths))
	for i, p := range paths {
		b[i] = strings.TrimPrefix(p, nix.StoreDir+"/")
	}
	return b
}

// seed puts o into the cache directly, NAR and narinfo signed by the signer's key, as an
// earlier publish would have.
func (e *env) seed(t *testing.T, o object) {
	t.Helper()
	e.putObject(t, nix.NarURL(o.out.FileHash), o.file)
	ni := nix.NewNarInfo(o.path(), o.sizes(), bases(o.out.References))
	ni.Deriver = strings.TrimPrefix(o.out.Deriver, nix.StoreDir+"/")
	if err := ni.Sign(e.key); err != nil {
		t.Fatal(err)
	}
	text, err := ni.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := nix.ParseStorePath(o.path())
	e.putObject(t, sp.Hash+".narinfo", text)
}

func (e *env) putObject(t *testing.T, key string, data []byte) {
	t.Helper()
	sum := sha256.Sum256(data)
	err := e.store.Put(ctx(t), key, bytes.NewReader(data), int64(len(data)), blob.PutOptions{SHA256: sum[:], IfAbsent: true})
	if err != nil && !errors.Is(err, blob.ErrExists) {
		t.Fatalf("put %s: %v", key, err)
	}
}

// put PUTs body to a presigned upload.
func put(t *testing.T, u *signerapi.Upload, body []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), u.Method, u.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range u.Headers {
		if http.CanonicalHeaderKey(k) == "Content-Length" {
			continue
		}
		req.Header[k] = vs
	}
	req.ContentLength = int64(len(body))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(res.Body)
		t.Fatalf("PUT %s: %s: %s", u.URL, res.Status, msg)
	}
}

// fixtures are the derivations fixtureSpec made, by label: a label always names one
// derivation, whichever test makes it.
var fixtures sync.Map

// fixtureSpec makes the derivation s describes (named label unless s names it), for the test
// system, and remembers it under label.
func fixtureSpec(label string, s queuetest.DrvSpec) queuetest.NixDrv {
	if s.Name == "" {
		s.Name = label
	}
	if s.System == "" {
		s.System = system
	}
	d := queuetest.MakeDrv(s)
	if old, loaded := fixtures.LoadOrStore(label, d); loaded && old.(queuetest.NixDrv).DrvPath != d.DrvPath {
		panic("fixture " + label + " made twice, differently")
	}
	return d
}

// fixture is a derivation called name, as Nix writes it, with the named fixtures as inputs and
// srcs as input sources.
func fixture(name string, inputs []string, srcs ...string) queuetest.NixDrv {
	var ins []queuetest.NixDrv
	for _, in := range inputs {
		ins = append(ins, lookup(in))
	}
	return fixtureSpec(name, queuetest.DrvSpec{Inputs: ins, Srcs: srcs})
}

func lookup(label string) queuetest.NixDrv {
	d, ok := fixtures.Load(label)
	if !ok {
		panic("no fixture " + label)
	}
	return d.(queuetest.NixDrv)
}

func drvPath(label string) string { return lookup(label).DrvPath }
func outPath(label string) string { return lookup(label).Out("out") }

func drvBase(label string) string {
	return strings.TrimPrefix(drvPath(label), nix.StoreDir+"/")
}

func logKey(label string) string { return "log/" + drvBase(label) }

func jobStatus(t *testing.T, pool *pgxpool.Pool, label string) status.JobStatus {
	t.Helper()
	return queuetest.JobOf(t, pool, drvPath(label)).Status
}

// hashPart is the hash part of store path p.
func hashPart(t *testing.T, p string) string {
	t.Helper()
	sp, err := nix.ParseStorePath(p)
	if err != nil {
		t.Fatal(err)
	}
	return sp.Hash
}

// claim claims one job as node and checks it is the job of the fixture label.
func (e *env) claim(t *testing.T, node, label string) queue.Job {
	t.Helper()
	return e.claimPath(t, node, drvPath(label))
}

// claimPath claims one job as node and checks it is the job of the derivation at drv.
func (e *env) claimPath(t *testing.T, node, drv string) queue.Job {
	t.Helper()
	if queuetest.QueryInt(t, e.pool, `SELECT count(*) FROM nodes WHERE id = $1`, node) == 0 {
		queuetest.InsertNode(t, e.pool, queuetest.Node{ID: node, Systems: []string{system}})
	}
	jobs, err := queue.ClaimJobs(ctx(t), e.pool, queue.Claimer{NodeID: node, Systems: []string{system}}, 1)
	if err != nil || len(jobs) != 1 || jobs[0].DrvPath != drv {
		t.Fatalf("claim %s as %s: %v %v", drv, node, jobs, err)
	}
	return jobs[0]
}

// enqueue stores the .drv files of ds and enqueues a job for each, as an evaluation publishes
// its .drv closure before it enqueues.
func (e *env) enqueue(t *testing.T, ds ...queuetest.NixDrv) {
	t.Helper()
	blobtest.EnqueueStored(t, e.pool, e.key, nil, ds...)
}

// enqueueAndClaim enqueues d and claims its job as node; d must be the only ready job.
func (e *env) enqueueAndClaim(t *testing.T, node string, d queuetest.NixDrv) queue.Job {
	t.Helper()
	e.enqueue(t, d)
	return e.claimPath(t, node, d.DrvPath)
}

var projects atomic.Int64

// evaluation inserts a running evaluation claimed by node (attempt 1) and returns its claim.
func (e *env) evaluation(t *testing.T, node string) signerapi.EvalClaim {
	t.Helper()
	project := queuetest.NewProject(t, e.pool, fmt.Sprint("project-", projects.Add(1)), 100)
	id := queuetest.QueryInt(t, e.pool, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at, attempt)
VALUES ($1, 'git+file:///src', md5(random()::text), 'main', 'running', $2, now(), now(), 1) RETURNING id`, project, node)
	return signerapi.EvalClaim{ID: id, Attempt: 1}
}

func jobClaim(j queue.Job) *signerapi.JobClaim {
	return &signerapi.JobClaim{ID: j.ID, Attempt: j.Attempt}
}

func complete(j queue.Job, log string, outs ...object) signerapi.BuildCompleteRequest {
	req := signerapi.BuildCompleteRequest{Job: *jobClaim(j), LogKey: log, Outputs: []signerapi.Output{}}
	for _, o := range outs {
		req.Outputs = append(req.Outputs, o.out)
	}
	return req
}

func logUpload(key string, body []byte) *signerapi.LogUpload {
	sum := sha256.Sum256(body)
	return &signerapi.LogUpload{Key: key, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])}
}

// upload asks for slots under req's claim (Outputs are filled from objs) and PUTs every file,
// and the log, that is not skipped.
func (e *env) upload(t *testing.T, token string, req signerapi.UploadSlotsRequest, logBody []byte, objs ...object) signerapi.UploadSlotsResponse {
	t.Helper()
	req.Outputs = []signerapi.Output{}
	for _, o := range objs {
		req.Outputs = append(req.Outputs, o.out)
	}
	var resp signerapi.UploadSlotsResponse
	e.mustPost(t, "/api/upload-slots", token, req, &resp)
	if len(resp.Outputs) != len(objs) {
		t.Fatalf("upload-slots answered %d outputs, want %d", len(resp.Outputs), len(objs))
	}
	for i, s := range resp.Outputs {
		if s.StorePath != objs[i].path() {
			t.Fatalf("slot %d is for %s, want %s", i, s.StorePath, objs[i].path())
		}
		if !s.Skipped {
			if s.Upload == nil {
				t.Fatalf("slot %d: neither skipped nor an upload", i)
			}
			put(t, s.Upload, objs[i].file)
		}
	}
	if req.Log != nil {
		if resp.Log == nil {
			t.Fatal("no log upload")
		}
		put(t, resp.Log, logBody)
	}
	return resp
}

// read returns the cache object key: from the blob store or, for the .drv objects, the database.
func (e *env) read(t *testing.T, key string) ([]byte, bool) {
	t.Helper()
	r, _, err := e.store.Get(ctx(t), key)
	if errors.Is(err, blob.ErrNotFound) {
		drvs := blob.NewDerivations(e.pool)
		var data []byte
		if h, ok := strings.CutSuffix(key, ".narinfo"); ok {
			data, _, err = drvs.NarInfo(ctx(t), h)
		} else if blob.IsPlainNAR(key) {
			data, _, err = drvs.NAR(ctx(t), key)
		}
		if err != nil && !errors.Is(err, blob.ErrNotFound) {
			t.Fatal(err)
		}
		return data, err == nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return data, true
}

func (e *env) narInfo(t *testing.T, path string) (*nix.NarInfo, bool) {
	t.Helper()
	sp, err := nix.ParseStorePath(path)
	if err != nil {
		t.Fatal(err)
	}
	data, ok := e.read(t, sp.Hash+".narinfo")
	if !ok {
		return nil, false
	}
	ni, err := nix.ParseNarInfo(data)
	if err != nil {
		t.Fatalf("parse narinfo of %s: %v\n%s", path, err, data)
	}
	return ni, true
}

// checkNarInfo asserts that the cache serves o signed by the signer, with refs (store paths)
// and deriver (a basename), and the NAR it was uploaded with.
func (e *env) checkNarInfo(t *testing.T, o object, refs []string, deriver, caPrefix string) *nix.NarInfo {
	t.Helper()
	ni, ok := e.narInfo(t, o.path())
	if !ok {
		t.Fatalf("no narinfo for %s", o.path())
	}
	if !ni.Verify(e.key.Public()) {
		t.Fatalf("narinfo of %s: signature does not verify", o.path())
	}
	want := slices.Sorted(slices.Values(bases(refs)))
	if got := slices.Sorted(slices.Values(ni.References)); !slices.Equal(got, want) {
		t.Fatalf("narinfo of %s: references %v, want %v", o.path(), got, want)
	}
	if ni.StorePath != o.path() || ni.NarHash != o.out.NarHash || ni.NarSize != o.out.NarSize ||
		ni.FileHash != o.out.FileHash || ni.FileSize != o.out.FileSize || ni.Compression != "zstd" ||
		ni.Deriver != deriver || !strings.HasPrefix(ni.CA, caPrefix) || (caPrefix == "") != (ni.CA == "") {
		t.Fatalf("narinfo %+v does not describe %+v with deriver %q and CA %q…", ni, o.out, deriver, caPrefix)
	}
	if file, ok := e.read(t, ni.URL); !ok || !bytes.Equal(file, o.file) {
		t.Fatalf("narinfo of %s: its URL %s does not serve the uploaded NAR", o.path(), ni.URL)
	}
	return ni
}

func (e *env) outputHash(t *testing.T, name string) *string {
	t.Helper()
	var h *string
	if err := e.pool.QueryRow(ctx(t), `SELECT nar_hash FROM derivation_outputs WHERE drv_path = $1`,
		drvPath(name)).Scan(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

func (e *env) logURL(t *testing.T, j queue.Job) string {
	t.Helper()
	var u *string
	if err := e.pool.QueryRow(ctx(t), `SELECT log_url FROM build_jobs WHERE id = $1`, j.ID).Scan(&u); err != nil {
		t.Fatal(err)
	}
	if u == nil {
		return ""
	}
	return *u
}

// state is everything a request could change: every object of the store (key → sha256 of its
// bytes) and the rows the signer writes.
type state struct {
	objects map[string]string
	db      string
}

func (e *env) state(t *testing.T) state {
	t.Helper()
	s := state{objects: map[string]string{}}
	var keys []string
	if err := e.store.List(ctx(t), "", func(i blob.Info) error { keys = append(keys, i.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		data, ok := e.read(t, k)
		if !ok {
			t.Fatalf("listed %s, but it cannot be read", k)
		}
		sum := sha256.Sum256(data)
		s.objects[k] = hex.EncodeToString(sum[:])
	}
	err := e.pool.QueryRow(ctx(t), `
SELECT COALESCE((SELECT string_agg(format('job %s %s %s %s %s %s', id, status, claimed_by, attempt, log_url, finished_at), E'\n' ORDER BY id)
                 FROM build_jobs), '') || E'\n' ||
       COALESCE((SELECT string_agg(format('output %s %s %s %s', drv_path, output_name, nar_hash, nar_size), E'\n' ORDER BY drv_path, output_name)
                 FROM derivation_outputs), '') || E'\n' ||
       COALESCE((SELECT string_agg(format('eval %s %s %s %s', id, status, claimed_by, attempt), E'\n' ORDER BY id)
                 FROM evaluations), '') || E'\n' ||
       COALESCE((SELECT string_agg(format('drv %s %s', hash_part, md5(narinfo)), E'\n' ORDER BY hash_part)
                 FROM drv_objects), '')`).Scan(&s.db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// unchanged asserts that nothing in the store or the signer's rows changed since before.
func (e *env) unchanged(t *testing.T, before state, what string) {
	t.Helper()
	after := e.state(t)
	if !maps.Equal(before.objects, after.objects) {
		for k, v := range after.objects {
			if before.objects[k] != v {
				t.Errorf("%s: object %s was written", what, k)
			}
		}
		for k := range before.objects {
			if _, ok := after.objects[k]; !ok {
				t.Errorf("%s: object %s was deleted", what, k)
			}
		}
		t.FailNow()
	}
	if before.db != after.db {
		t.Fatalf("%s changed the database:\nbefore:\n%s\nafter:\n%s", what, before.db, after.db)
	}
}

// happyPath builds two jobs in dependency order through the whole protocol: real NARs and logs
// through presigned URLs, build-complete, signed narinfos. The second job's output refers to its
// input's output, to that output's own runtime dependency (reached only through the cache's
// narinfos) and to itself.
func happyPath(t *testing.T, e *env) {
	runtime := source(t, "runtime-lib", "a library some input refers to at run time")
	script := textFile(t, "dep-builder.sh", "echo building dep\n")
	e.seed(t, runtime)
	e.seed(t, script)
	e.enqueue(t, fixture("dep", nil, script.path(), runtime.path()))
	e.enqueue(t, fixture("hello", []string{"dep"}))
	tok := e.builder(t, "builder-1")

	// dep: its output refers to the runtime library, an input source of dep.
	dj := e.claim(t, "builder-1", "dep")
	dep := built(t, outPath("dep"), "dep", runtime.path())
	e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(dj), Log: logUpload(logKey("dep"), []byte("dep log"))}, []byte("dep log"), dep)
	var resp signerapi.BuildCompleteResponse
	e.mustPost(t, "/api/build-complete", tok, complete(dj, logKey("dep"), dep), &resp)
	if resp != (signerapi.BuildCompleteResponse{Written: 1}) {
		t.Fatalf("build-complete of dep answered %+v", resp)
	}

	// hello: now ready.
	hj := e.claim(t, "builder-1", "hello")
	hello := built(t, outPath("hello"), "#!/bin/sh\necho hello\n",
		dep.path(), runtime.path(), outPath("hello"))
	// As a builder sends it: the log at the derivation's latest key alone, then at the
	// attempt's own key with the outputs, which build-complete records.
	logBody := []byte("building hello\ndone\n")
	helloAttempt := queue.AttemptLogKey(hj.DrvPath, hj.Attempt)
	e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(hj), Log: logUpload(logKey("hello"), logBody)}, logBody)
	slots := e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(hj), Log: logUpload(helloAttempt, logBody)}, logBody, hello)
	if slots.Outputs[0].Skipped {
		t.Fatal("the first upload-slots skipped the output")
	}
	e.mustPost(t, "/api/build-complete", tok, complete(hj, helloAttempt, hello), &resp)
	if resp != (signerapi.BuildCompleteResponse{Written: 1}) {
		t.Fatalf("build-complete of hello answered %+v", resp)
	}

	for _, c := range []struct {
		name string
		job  queue.Job
		obj  object
		refs []string
		log  []byte
		key  string // the log build-complete recorded
	}{
		{"dep", dj, dep, []string{runtime.path()}, []byte("dep log"), logKey("dep")},
		{"hello", hj, hello, []string{dep.path(), runtime.path(), hello.path()}, logBody, helloAttempt},
	} {
		if s := jobStatus(t, e.pool, c.name); s != status.JobSucceeded {
			t.Fatalf("%s is %s, want succeeded", c.name, s)
		}
		// The signer names the job's derivation as deriver: the request left it empty.
		e.checkNarInfo(t, c.obj, c.refs, drvBase(c.name), "")
		if got := e.logURL(t, c.job); got != c.key {
			t.Fatalf("%s: log_url = %q, want %s", c.name, got, c.key)
		}
		for _, k := range []string{logKey(c.name), c.key} {
			if got, ok := e.read(t, k); !ok || !bytes.Equal(got, c.log) {
				t.Fatalf("%s: the stored log %s is %q, want %q", c.name, k, got, c.log)
			}
		}
		// The attempt is recorded with its own log, when it sent one.
		var attemptLog *string
		if err := e.pool.QueryRow(ctx(t), `SELECT log_key FROM build_attempts WHERE job_id = $1 AND attempt = $2`,
			c.job.ID, c.job.Attempt).Scan(&attemptLog); err != nil {
			t.Fatalf("%s: its attempt: %v", c.name, err)
		}
		if want := c.key != logKey(c.name); (attemptLog != nil) != want || (want && *attemptLog != c.key) {
			t.Fatalf("%s: the attempt's log_key = %v, want %q", c.name, attemptLog, c.key)
		}
		if h := e.outputHash(t, c.name); h == nil || *h != c.obj.out.NarHash {
			t.Fatalf("%s: derivation_outputs.nar_hash = %v, want %s", c.name, h, c.obj.out.NarHash)
		}
	}

	// A retry finds the file in place and hands out no URL; the job is finished, so the claim
	// is gone.
	var again signerapi.UploadSlotsResponse
	code, body := e.post(t, "/api/upload-slots", tok, signerapi.UploadSlotsRequest{Job: jobClaim(hj), Outputs: []signerapi.Output{hello.out}}, &again)
	if code != http.StatusConflict {
		t.Fatalf("upload-slots of a finished job: %d %s, want 409", code, body)
	}
	// Under a live claim of an equivalent derivation (fixed-output, of the same hash, fetched
	// another way), a NAR already in place is skipped.
	tarball := source(t, "tarball", "fetched sources")
	sum := tarball.narSum(t)
	fetched := fixtureSpec("tarball-1", queuetest.DrvSpec{Name: "tarball", FixedNAR: &sum, Script: "fetch from mirror 1"})
	other := fixtureSpec("tarball-2", queuetest.DrvSpec{Name: "tarball", FixedNAR: &sum, Script: "fetch from mirror 2"})
	if fetched.Out("out") != tarball.path() || other.Out("out") != tarball.path() || fetched.DrvPath == other.DrvPath {
		t.Fatalf("fixed-output derivations %s and %s: outputs %s and %s, want %s", fetched.DrvPath, other.DrvPath,
			fetched.Out("out"), other.Out("out"), tarball.path())
	}
	fj := e.enqueueAndClaim(t, "builder-1", fetched)
	e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(fj)}, nil, tarball)
	e.mustPost(t, "/api/build-complete", tok, complete(fj, "", tarball), &resp)
	oj := e.enqueueAndClaim(t, "builder-1", other)
	e.mustPost(t, "/api/upload-slots", tok, signerapi.UploadSlotsRequest{Job: jobClaim(oj), Outputs: []signerapi.Output{tarball.out}}, &again)
	if !again.Outputs[0].Skipped || again.Outputs[0].Upload != nil {
		t.Fatalf("second upload-slots: %+v, want skipped without URL", again.Outputs[0])
	}
}

func TestHappyPathLocal(t *testing.T) {
	t.Parallel()
	happyPath(t, newEnv(t, false))
}

func TestHappyPathMinIO(t *testing.T) {
	t.Parallel()
	happyPath(t, newEnv(t, true))
}

func TestNotUploadedAndStaleClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	j := e.enqueueAndClaim(t, "builder-1", fixture("late", nil))
	b := built(t, outPath("late"), "late")
	tok := e.builder(t, "builder-1")

	before := e.state(t)
	code, body := e.post(t, "/api/build-complete", tok, complete(j, "", b), nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "outputs[0]: nar not uploaded") {
		t.Fatalf("build-complete before the upload: %d %s", code, body)
	}
	e.unchanged(t, before, "build-complete before the upload")

	// A log that was never uploaded is refused too.
	e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(j)}, nil, b)
	before = e.state(t)
	code, body = e.post(t, "/api/build-complete", tok, complete(j, logKey("late"), b), nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "log_key") {
		t.Fatalf("build-complete with a log never uploaded: %d %s", code, body)
	}
	e.unchanged(t, before, "build-complete with a log never uploaded")

	queuetest.InsertNode(t, e.pool, queuetest.Node{ID: "builder-2", Systems: []string{system}})
	wrongAttempt, otherJob := j, j
	wrongAttempt.Attempt++
	otherJob.ID += 1000
	for _, c := range []struct {
		name  string
		token string
		job   queue.Job
	}{
		{"wrong attempt", tok, wrongAttempt},
		{"no such job", tok, otherJob},
		{"another node's token", e.builder(t, "builder-2"), j},
	} {
		code, body := e.post(t, "/api/build-complete", c.token, complete(c.job, "", b), nil)
		if code != http.StatusConflict || !strings.Contains(body, "is not in building/uploading for node") {
			t.Fatalf("%s: %d %s, want 409", c.name, code, body)
		}
		code, body = e.post(t, "/api/upload-slots", c.token, signerapi.UploadSlotsRequest{Job: jobClaim(c.job), Outputs: []signerapi.Output{b.out}}, nil)
		if code != http.StatusConflict {
			t.Fatalf("%s: upload-slots %d %s, want 409", c.name, code, body)
		}
		e.unchanged(t, before, c.name)
	}
	if got := queuetest.JobOf(t, e.pool, drvPath("late")); got.Status != status.JobBuilding || got.Attempt != j.Attempt {
		t.Fatalf("the job changed: %s", got)
	}

	// The right claim still goes through; a repeat after the success is a 409 that changes
	// nothing.
	e.mustPost(t, "/api/build-complete", tok, complete(j, "", b), nil)
	before = e.state(t)
	if code, _ := e.post(t, "/api/build-complete", tok, complete(j, "", b), nil); code != http.StatusConflict {
		t.Fatalf("a second build-complete of a succeeded job: %d, want 409", code)
	}
	e.unchanged(t, before, "a second build-complete")
}

// Two builds of the same output path (derivations that differ but hash alike, as Nix treats
// them as one: here each takes another fixed-output derivation of the same hash; or a
// non-reproducible rebuild): the first narinfo stays, the second build still succeeds, and the
// canonical hash is the first one's.
func TestFirstWriterWins(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	src := source(t, "shared-src", "the sources every mirror serves")
	sum := src.narSum(t)
	tok := e.builder(t, "builder-1")
	jobs := map[string]queue.Job{}
	var out string
	for _, name := range []string{"one", "two", "three"} {
		fetch := fixtureSpec("shared-src-"+name, queuetest.DrvSpec{Name: "shared-src", FixedNAR: &sum, Script: "fetch from mirror " + name})
		blobtest.PutDerivations(t, e.pool, e.key, map[string][]byte{fetch.DrvPath: fetch.Text})
		d := fixtureSpec(name, queuetest.DrvSpec{Name: "shared", Inputs: []queuetest.NixDrv{fetch}})
		if out == "" {
			out = d.Out("out")
		} else if d.Out("out") != out {
			t.Fatalf("%s: output %s, want the shared %s", d.DrvPath, d.Out("out"), out)
		}
		jobs[name] = e.enqueueAndClaim(t, "builder-1", d)
	}
	first := built(t, out, "first build")
	second := built(t, out, "second, different build")

	e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(jobs["one"])}, nil, first)
	var r signerapi.BuildCompleteResponse
	e.mustPost(t, "/api/build-complete", tok, complete(jobs["one"], "", first), &r)
	if r != (signerapi.BuildCompleteResponse{Written: 1}) {
		t.Fatalf("first build-complete answered %+v", r)
	}
	narinfo, _ := e.read(t, hashPart(t, out)+".narinfo")

	e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(jobs["two"])}, nil, second)
	e.mustPost(t, "/api/build-complete", tok, complete(jobs["two"], "", second), &r)
	if r != (signerapi.BuildCompleteResponse{Conflicts: 1}) {
		t.Fatalf("second build-complete answered %+v, want one conflict", r)
	}
	// The identical result again is skipped.
	e.mustPost(t, "/api/build-complete", tok, complete(jobs["three"], "", first), &r)
	if r != (signerapi.BuildCompleteResponse{Skipped: 1}) {
		t.Fatalf("third build-complete answered %+v, want one skipped", r)
	}

	if now, _ := e.read(t, hashPart(t, out)+".narinfo"); !bytes.Equal(now, narinfo) {
		t.Fatalf("narinfo rewritten:\n%s\nwas:\n%s", now, narinfo)
	}
	e.checkNarInfo(t, first, nil, drvBase("one"), "")
	if code, _ := e.post(t, "/api/build-complete", "", complete(jobs["one"], "", first), nil); code != http.StatusUnauthorized {
		t.Fatalf("build-complete without a token: %d, want 401", code)
	}
	want := map[string]float64{
		`harmonia_ci_signer_narinfos_total{result="written"}`:                     1,
		`harmonia_ci_signer_narinfos_total{result="conflict"}`:                    1,
		`harmonia_ci_signer_narinfos_total{result="skipped"}`:                     1,
		`harmonia_ci_signer_requests_total{code="2xx",endpoint="upload-slots"}`:   2,
		`harmonia_ci_signer_requests_total{code="2xx",endpoint="build-complete"}`: 3,
		`harmonia_ci_signer_requests_total{code="4xx",endpoint="build-complete"}`: 1,
		`harmonia_ci_signer_requests_total{code="5xx",endpoint="build-complete"}`: 0,
		`harmonia_ci_signer_upload_bytes_total{kind="nar"}`:                       float64(first.out.FileSize + second.out.FileSize),
		`harmonia_ci_signer_upload_bytes_total{kind="log"}`:                       0,
	}
	got := counters(t, e.reg)
	for series, v := range want {
		if got[series] != v {
			t.Errorf("%s = %v, want %v", series, got[series], v)
		}
	}
	for name := range jobs {
		if h := e.outputHash(t, name); h == nil || *h != first.out.NarHash {
			t.Fatalf("%s: nar_hash = %v, want the first %s", name, h, first.out.NarHash)
		}
		if s := jobStatus(t, e.pool, name); s != status.JobSucceeded {
			t.Fatalf("%s is %s, want succeeded", name, s)
		}
	}
}

// Malformed requests are refused with 400 naming the field, before anything is written.
func TestValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	j := e.enqueueAndClaim(t, "builder-1", fixture("v", nil))
	ev := e.evaluation(t, "eval-1")
	tok := e.token(t, "builder-1", config.RoleBuilder)
	etok := e.token(t, "eval-1", config.RoleEvaluator)
	good := built(t, outPath("v"), "v").out
	mod := func(f func(o *signerapi.Output)) signerapi.Output { o := good; f(&o); return o }
	slots := func(outs ...signerapi.Output) signerapi.UploadSlotsRequest {
		return signerapi.UploadSlotsRequest{Job: jobClaim(j), Outputs: outs}
	}
	withLog := func(l signerapi.LogUpload) signerapi.UploadSlotsRequest { r := slots(good); r.Log = &l; return r }
	bc := func(outs ...signerapi.Output) signerapi.BuildCompleteRequest {
		return signerapi.BuildCompleteRequest{Job: *jobClaim(j), Outputs: outs}
	}
	zeros := strings.Repeat("0", 64)
	for _, c := range []struct {
		name  string
		path  string
		token string
		body  any
		want  string
	}{
		{"neither claim", "/api/upload-slots", tok, signerapi.UploadSlotsRequest{Outputs: []signerapi.Output{good}}, "exactly one of job and eval"},
		{"both claims", "/api/upload-slots", e.token(t, "builder-1", config.RoleBuilder, config.RoleEvaluator),
			signerapi.UploadSlotsRequest{Job: jobClaim(j), Eval: &ev, Outputs: []signerapi.Output{good}}, "exactly one of job and eval"},
		{"nothing", "/api/upload-slots", tok, slots(), "outputs: nothing to upload"},
		{"eval nothing", "/api/upload-slots", etok, signerapi.UploadSlotsRequest{Eval: &ev}, "outputs: nothing to upload"},
		{"eval log", "/api/upload-slots", etok, signerapi.UploadSlotsRequest{Eval: &ev, Outputs: []signerapi.Output{good}, Log: logUpload(logKey("v"), nil)}, "log: only a build"},
		{"store path", "/api/upload-slots", tok, slots(good, mod(func(o *signerapi.Output) { o.StorePath = "/tmp/x" })), "outputs[1].store_path"},
		{"twice", "/api/upload-slots", tok, slots(good, good), "outputs[1]: " + good.StorePath + " is listed twice"},
		{"nar hash", "/api/upload-slots", tok, slots(mod(func(o *signerapi.Output) { o.NarHash = "sha256:abc" })), "outputs[0].nar_hash"},
		{"file hash", "/api/upload-slots", tok, slots(mod(func(o *signerapi.Output) { o.FileHash = "md5:x" })), "outputs[0].file_hash"},
		{"nar size", "/api/upload-slots", tok, slots(mod(func(o *signerapi.Output) { o.NarSize = 0 })), "outputs[0].nar_size"},
		{"file size", "/api/upload-slots", tok, slots(mod(func(o *signerapi.Output) { o.FileSize = -1 })), "outputs[0].file_size"},
		{"reference", "/api/build-complete", tok, bc(mod(func(o *signerapi.Output) { o.References = []string{"nope"} })), "outputs[0].references[0]"},
		{"deriver", "/api/build-complete", tok, bc(mod(func(o *signerapi.Output) { o.Deriver = "../x" })), "outputs[0].deriver"},
		{"no outputs", "/api/build-complete", tok, bc(), "outputs: at least one output"},
		{"log prefix", "/api/upload-slots", tok, withLog(signerapi.LogUpload{Key: "nar/x", Size: 1, SHA256: zeros}), "log.key"},
		{"log traversal", "/api/upload-slots", tok, withLog(signerapi.LogUpload{Key: "log/../" + queuetest.Hash("v") + ".narinfo", Size: 1, SHA256: zeros}), "log.key"},
		{"log sha", "/api/upload-slots", tok, withLog(signerapi.LogUpload{Key: logKey("v"), Size: 1, SHA256: "zz"}), "log.sha256"},
		{"log size", "/api/upload-slots", tok, withLog(signerapi.LogUpload{Key: logKey("v"), Size: -1, SHA256: zeros}), "log.size"},
		{"log key of build-complete", "/api/build-complete", tok, signerapi.BuildCompleteRequest{Job: *jobClaim(j), Outputs: []signerapi.Output{good}, LogKey: "nar/x"}, "log_key"},
		{"not json", "/api/upload-slots", tok, []byte("just a string"), "invalid JSON"},
		{"publish nothing", "/api/publish", etok, signerapi.PublishRequest{Eval: ev}, "nothing to publish"},
		{"publish drv name", "/api/publish", etok, signerapi.PublishRequest{Eval: ev, Derivations: []signerapi.DerivationText{{StorePath: fakePath("x", "x"), Text: "Derive()"}}}, "derivations[0]"},
		{"publish drv text", "/api/publish", etok, signerapi.PublishRequest{Eval: ev, Derivations: []signerapi.DerivationText{{StorePath: fakePath("x", "x.drv"), Text: "not ATerm"}}}, "derivations[0]"},
		{"lookup path", "/api/cache-lookup", tok, signerapi.CacheLookupRequest{StorePaths: []string{"/nix/store/short"}}, "store_paths[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := e.state(t)
			code, body := e.post(t, c.path, c.token, c.body, nil)
			if code != http.StatusBadRequest || !strings.Contains(body, c.want) {
				t.Fatalf("%d %s, want 400 naming %q", code, body, c.want)
			}
			e.unchanged(t, before, c.name)
		})
	}
	// An oversized body is refused with 413.
	huge := slots(mod(func(o *signerapi.Output) { o.Deriver = strings.Repeat("x", signerapi.MaxRequestBody) }))
	if code, _ := e.post(t, "/api/upload-slots", tok, huge, nil); code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d, want 413", code)
	}
	if n := len(e.state(t).objects); n != 0 {
		t.Fatalf("the store has %d objects after invalid requests", n)
	}
}

// A failed build uploads its log alone: upload-slots with a log and no outputs hands out the
// log's URL, and the upload lands under the key.
func TestLogOnlySlots(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	j := e.enqueueAndClaim(t, "builder-1", fixture("failed", nil))
	body := []byte("error: build failed\n")
	resp := e.upload(t, e.builder(t, "builder-1"), signerapi.UploadSlotsRequest{Job: jobClaim(j), Log: logUpload(logKey("failed"), body)}, body)
	if resp.Log == nil || len(resp.Outputs) != 0 {
		t.Fatalf("log-only upload-slots answered %+v", resp)
	}
	if got, ok := e.read(t, logKey("failed")); !ok || !bytes.Equal(got, body) {
		t.Fatalf("the log is %q in the store, want %q", got, body)
	}
	// The claim's own attempt key is granted too, not another attempt's.
	own := queue.AttemptLogKey(j.DrvPath, j.Attempt)
	e.upload(t, e.builder(t, "builder-1"), signerapi.UploadSlotsRequest{Job: jobClaim(j), Log: logUpload(own, body)}, body)
	if got, ok := e.read(t, own); !ok || !bytes.Equal(got, body) {
		t.Fatalf("the attempt's log is %q in the store, want %q", got, body)
	}
	for _, key := range []string{queue.AttemptLogKey(j.DrvPath, j.Attempt+1), queue.AttemptLogKey(j.DrvPath, j.Attempt-1), logKey("failed") + ".x"} {
		code, resp := e.post(t, "/api/upload-slots", e.builder(t, "builder-1"), signerapi.UploadSlotsRequest{Job: jobClaim(j), Log: logUpload(key, body)}, nil)
		if code != http.StatusBadRequest || !strings.Contains(resp, "log.key") {
			t.Fatalf("upload-slots of log %s: %d %s, want 400 naming log.key", key, code, resp)
		}
	}
	// Uploading a log writes no narinfo and finishes nothing: the worker records the failure.
	if s := jobStatus(t, e.pool, "failed"); s != status.JobBuilding {
		t.Fatalf("the job is %s, want building", s)
	}
}

// A build completes with all of its derivation's outputs or not at all: dependents substitute
// every output they select.
func TestAllOutputs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	d := fixtureSpec("multi", queuetest.DrvSpec{Outputs: []string{"dev", "out"}})
	j := e.enqueueAndClaim(t, "builder-1", d)
	tok := e.builder(t, "builder-1")
	out := built(t, d.Out("out"), "out")
	dev := built(t, d.Out("dev"), "dev", out.path())
	e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(j)}, nil, out, dev)

	for _, c := range []struct {
		name string
		outs []object
		want string
	}{
		{"out only", []object{out}, "outputs: " + dev.path() + ", an output of " + d.DrvPath + ", is missing"},
		{"dev only", []object{dev}, "outputs: " + out.path() + ", an output of " + d.DrvPath + ", is missing"},
		{"out twice", []object{out, out}, "is listed twice"},
		{"none", nil, "at least one output"},
	} {
		before := e.state(t)
		code, body := e.post(t, "/api/build-complete", tok, complete(j, "", c.outs...), nil)
		if code != http.StatusBadRequest || !strings.Contains(body, c.want) {
			t.Fatalf("%s: %d %s, want 400 naming %q", c.name, code, body, c.want)
		}
		e.unchanged(t, before, c.name)
	}
	var resp signerapi.BuildCompleteResponse
	e.mustPost(t, "/api/build-complete", tok, complete(j, "", dev, out), &resp)
	if resp != (signerapi.BuildCompleteResponse{Written: 2}) {
		t.Fatalf("build-complete answered %+v", resp)
	}
	// dev refers to out, an output of the same build.
	e.checkNarInfo(t, dev, []string{out.path()}, drvBase("multi"), "")
	e.checkNarInfo(t, out, nil, drvBase("multi"), "")
}

// counters reads every counter of reg by series, written as in the exposition format with
// labels sorted by name.
func counters(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	return out
}
