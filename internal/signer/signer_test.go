package signer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

func TestMain(m *testing.M) { dbtest.Main(m, blobtest.Cleanup) }

const (
	testToken = "cluster-secret-token"
	system    = "x86_64-linux"
)

// env is a signer on a real database and store, served over HTTP with the local store's
// upload handler on the same server.
type env struct {
	pool  *pgxpool.Pool
	store blob.Store
	key   nix.SecretKey
	url   string // signer base URL
}

func newEnv(t *testing.T, s3 bool) *env {
	t.Helper()
	pool := dbtest.NewPool(t)
	key, err := nix.GenerateKey("test-cache-1")
	if err != nil {
		t.Fatal(err)
	}
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
		l, err := blob.NewLocal(t.TempDir(), ts.URL, []byte("0123456789abcdef0123456789abcdef"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		mux.Handle("PUT /api/blob/", l.UploadHandler())
		store = l
	}
	srv, err := New(Config{Store: store, Key: key, ClusterToken: testToken, Logger: queuetest.TestLogger(t)}, pool)
	if err != nil {
		t.Fatal(err)
	}
	srv.Register(mux)
	return &env{pool: pool, store: store, key: key, url: ts.URL}
}

func ctx(t *testing.T) context.Context { return queuetest.Ctx(t, 30*time.Second) }

// post sends body with token ("" for none) and decodes a 200 answer into out.
func (e *env) post(t *testing.T, path, token string, body, out any) (int, string) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
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

// built is a store path with its compressed NAR.
type built struct {
	out  Output
	file []byte
}

// buildPath makes a real NAR of a small tree with content and describes it as storePath.
func buildPath(t *testing.T, storePath, content string, refs ...string) built {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "out")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "hello"), []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	sz, err := nix.CompressNAR(context.Background(), dir, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if refs == nil {
		refs = []string{}
	}
	return built{
		out: Output{StorePath: storePath, NarHash: sz.NarHash, NarSize: sz.NarSize,
			FileHash: sz.FileHash, FileSize: sz.FileSize, References: refs},
		file: buf.Bytes(),
	}
}

func put(t *testing.T, u *Upload, body []byte) {
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

// job enqueues a derivation called name whose output is outPath, claims it as node and
// returns the claim.
func job(t *testing.T, pool *pgxpool.Pool, name, outPath, node string) queue.Job {
	t.Helper()
	d := queuetest.Drv(name, system)
	d.Outputs[0].Path = outPath
	queuetest.Enqueue(t, pool, nil, d)
	if queuetest.QueryInt(t, pool, `SELECT count(*) FROM nodes WHERE id = $1`, node) == 0 {
		queuetest.InsertNode(t, pool, queuetest.Node{ID: node, Systems: []string{system}})
	}
	jobs, err := queue.ClaimJobs(ctx(t), pool, queue.Claimer{NodeID: node, Systems: []string{system}}, 1)
	if err != nil || len(jobs) != 1 {
		t.Fatalf("claim %s: %v %v", name, jobs, err)
	}
	return jobs[0]
}

func storePath(key, name string) string { return "/nix/store/" + queuetest.Hash(key) + "-" + name }

func logKey(name string) string {
	return "log/" + strings.TrimPrefix(queuetest.DrvPath(name), "/nix/store/")
}

func countObjects(t *testing.T, s blob.Store) int {
	t.Helper()
	n := 0
	if err := s.List(ctx(t), "", func(blob.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) narInfo(t *testing.T, path string) (*nix.NarInfo, bool) {
	t.Helper()
	sp, err := nix.ParseStorePath(path)
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := e.store.Get(ctx(t), sp.Hash+".narinfo")
	if errors.Is(err, blob.ErrNotFound) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data, _ := io.ReadAll(r)
	ni, err := nix.ParseNarInfo(data)
	if err != nil {
		t.Fatalf("parse narinfo of %s: %v\n%s", path, err, data)
	}
	return ni, true
}

func outputHash(t *testing.T, pool *pgxpool.Pool, drvName string) *string {
	t.Helper()
	var h *string
	if err := pool.QueryRow(ctx(t), `SELECT nar_hash FROM derivation_outputs WHERE drv_path = $1`,
		queuetest.DrvPath(drvName)).Scan(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

func complete(j queue.Job, log string, outs ...Output) BuildCompleteRequest {
	id := j.ID
	return BuildCompleteRequest{JobID: &id, NodeID: j.NodeID, Attempt: j.Attempt, Outputs: outs, LogKey: log}
}

// uploadAll asks for slots and PUTs every file (and the log) that is not skipped.
func (e *env) uploadAll(t *testing.T, logBody []byte, log string, bs ...built) UploadSlotsResponse {
	t.Helper()
	req := UploadSlotsRequest{}
	for _, b := range bs {
		req.Outputs = append(req.Outputs, b.out)
	}
	if log != "" {
		sum := sha256.Sum256(logBody)
		req.Log = &LogUpload{Key: log, Size: int64(len(logBody)), SHA256: hex.EncodeToString(sum[:])}
	}
	var resp UploadSlotsResponse
	if code, body := e.post(t, "/api/upload-slots", testToken, req, &resp); code != http.StatusOK {
		t.Fatalf("upload-slots: %d %s", code, body)
	}
	if len(resp.Outputs) != len(bs) {
		t.Fatalf("upload-slots answered %d outputs, want %d", len(resp.Outputs), len(bs))
	}
	for i, s := range resp.Outputs {
		if s.StorePath != bs[i].out.StorePath {
			t.Fatalf("slot %d is for %s, want %s", i, s.StorePath, bs[i].out.StorePath)
		}
		if !s.Skipped {
			if s.Upload == nil {
				t.Fatalf("slot %d: neither skipped nor an upload", i)
			}
			put(t, s.Upload, bs[i].file)
		}
	}
	if log != "" {
		if resp.Log == nil {
			t.Fatal("no log upload")
		}
		put(t, resp.Log, logBody)
	}
	return resp
}

func TestAuth(t *testing.T) {
	e := newEnv(t, false)
	out := storePath("auth-out", "auth")
	b := buildPath(t, out, "auth")
	j := job(t, e.pool, "auth", out, "builder1")
	for _, tc := range []struct{ name, token string }{{"none", ""}, {"wrong", "not-the-token"}, {"prefix", testToken[:5]}} {
		code, body := e.post(t, "/api/upload-slots", tc.token, UploadSlotsRequest{Outputs: []Output{b.out}}, nil)
		if code != http.StatusUnauthorized || strings.Contains(body, "http") {
			t.Errorf("%s token: upload-slots answered %d %s, want 401 without a URL", tc.name, code, body)
		}
		code, _ = e.post(t, "/api/build-complete", tc.token, complete(j, "", b.out), nil)
		if code != http.StatusUnauthorized {
			t.Errorf("%s token: build-complete answered %d, want 401", tc.name, code)
		}
	}
	if n := countObjects(t, e.store); n != 0 {
		t.Fatalf("store has %d objects after unauthorised requests", n)
	}
	// Even with the NAR in place, an unauthorised build-complete writes nothing.
	sum, _ := nix.ParseSHA256(b.out.FileHash)
	key := "nar/" + strings.TrimPrefix(b.out.FileHash, "sha256:") + ".nar.zst"
	if err := e.store.Put(ctx(t), key, bytes.NewReader(b.file), int64(len(b.file)), blob.PutOptions{SHA256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	if code, _ := e.post(t, "/api/build-complete", "wrong", complete(j, "", b.out), nil); code != http.StatusUnauthorized {
		t.Fatalf("build-complete with wrong token: %d", code)
	}
	if _, ok := e.narInfo(t, out); ok {
		t.Fatal("narinfo written without a valid token")
	}
	if s := queuetest.Status(t, e.pool, "auth"); s != "building" {
		t.Fatalf("job is %s, want building", s)
	}
}

// happyPath uploads a real NAR and a log through presigned URLs, completes the claimed job and
// checks everything the signer promises.
func happyPath(t *testing.T, e *env) {
	out := storePath("hello-out", "hello")
	dep := storePath("dep-out", "dep")
	b := buildPath(t, out, "#!/bin/sh\necho hello\n", dep, strings.TrimPrefix(out, "/nix/store/"))
	b.out.Deriver = strings.TrimPrefix(queuetest.DrvPath("hello"), "/nix/store/")
	j := job(t, e.pool, "hello", out, "builder1")
	logBody := []byte("building hello\ndone\n")
	lk := logKey("hello")

	slots := e.uploadAll(t, logBody, lk, b)
	if slots.Outputs[0].Skipped {
		t.Fatal("first upload-slots skipped the output")
	}
	var resp BuildCompleteResponse
	if code, body := e.post(t, "/api/build-complete", testToken, complete(j, lk, b.out), &resp); code != http.StatusOK {
		t.Fatalf("build-complete: %d %s", code, body)
	}
	if resp != (BuildCompleteResponse{Written: 1}) {
		t.Fatalf("build-complete answered %+v", resp)
	}
	if s := queuetest.Status(t, e.pool, "hello"); s != "succeeded" {
		t.Fatalf("job is %s, want succeeded", s)
	}
	var logURL *string
	if err := e.pool.QueryRow(ctx(t), `SELECT log_url FROM build_jobs WHERE id = $1`, j.ID).Scan(&logURL); err != nil {
		t.Fatal(err)
	}
	if logURL == nil || *logURL != lk {
		t.Fatalf("log_url = %v, want %s", logURL, lk)
	}
	ni, ok := e.narInfo(t, out)
	if !ok {
		t.Fatal("no narinfo")
	}
	if !ni.Verify(e.key.Public()) {
		t.Fatal("narinfo signature does not verify")
	}
	wantRefs := []string{strings.TrimPrefix(dep, "/nix/store/"), strings.TrimPrefix(out, "/nix/store/")}
	if ni.NarHash != b.out.NarHash || ni.NarSize != b.out.NarSize || ni.FileHash != b.out.FileHash ||
		ni.FileSize != b.out.FileSize || ni.Compression != "zstd" || ni.Deriver != b.out.Deriver ||
		strings.Join(ni.References, " ") != strings.Join(wantRefs, " ") {
		t.Fatalf("narinfo %+v does not describe %+v", ni, b.out)
	}
	// The narinfo's URL serves the uploaded file.
	r, _, err := e.store.Get(ctx(t), ni.URL)
	if err != nil {
		t.Fatalf("narinfo URL %s: %v", ni.URL, err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(got, b.file) {
		t.Fatal("stored NAR differs from the uploaded one")
	}
	if h := outputHash(t, e.pool, "hello"); h == nil || *h != b.out.NarHash {
		t.Fatalf("derivation_outputs.nar_hash = %v, want %s", h, b.out.NarHash)
	}

	// A retry finds the file in place and hands out no URL.
	var again UploadSlotsResponse
	if code, body := e.post(t, "/api/upload-slots", testToken, UploadSlotsRequest{Outputs: []Output{b.out}}, &again); code != http.StatusOK {
		t.Fatalf("second upload-slots: %d %s", code, body)
	}
	if !again.Outputs[0].Skipped || again.Outputs[0].Upload != nil {
		t.Fatalf("second upload-slots: %+v, want skipped without URL", again.Outputs[0])
	}
}

func TestHappyPathLocal(t *testing.T) { happyPath(t, newEnv(t, false)) }

func TestHappyPathMinIO(t *testing.T) { happyPath(t, newEnv(t, true)) }

func TestNotUploadedAndStaleClaim(t *testing.T) {
	e := newEnv(t, false)
	out := storePath("late-out", "late")
	b := buildPath(t, out, "late")
	j := job(t, e.pool, "late", out, "builder1")

	code, body := e.post(t, "/api/build-complete", testToken, complete(j, "", b.out), nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "outputs[0]: nar not uploaded") {
		t.Fatalf("build-complete before upload: %d %s", code, body)
	}
	// A log that was never uploaded is refused too.
	e.uploadAll(t, nil, "", b)
	code, body = e.post(t, "/api/build-complete", testToken, complete(j, logKey("late"), b.out), nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "log_key") {
		t.Fatalf("build-complete with missing log: %d %s", code, body)
	}

	wrongAttempt := j
	wrongAttempt.Attempt++
	otherNode := j
	otherNode.NodeID = "builder2"
	for name, c := range map[string]queue.Job{"wrong attempt": wrongAttempt, "other node": otherNode} {
		code, body := e.post(t, "/api/build-complete", testToken, complete(c, "", b.out), nil)
		if code != http.StatusConflict || !strings.Contains(body, "is not in building/uploading for node") {
			t.Fatalf("%s: %d %s", name, code, body)
		}
	}
	if _, ok := e.narInfo(t, out); ok {
		t.Fatal("narinfo written by a refused build-complete")
	}
	if h := outputHash(t, e.pool, "late"); h != nil {
		t.Fatalf("nar_hash recorded by a refused build-complete: %s", *h)
	}
	if got := queuetest.Job(t, e.pool, "late"); got.Status != "building" || got.Attempt != j.Attempt {
		t.Fatalf("job changed: %s", got)
	}
	// The right claim still goes through, and a repeat after success is a 409 that changes
	// nothing.
	if code, body := e.post(t, "/api/build-complete", testToken, complete(j, "", b.out), nil); code != http.StatusOK {
		t.Fatalf("build-complete with the right claim: %d %s", code, body)
	}
	if code, _ := e.post(t, "/api/build-complete", testToken, complete(j, "", b.out), nil); code != http.StatusConflict {
		t.Fatalf("second build-complete of a succeeded job: %d", code)
	}
}

func TestFirstWriterWins(t *testing.T) {
	e := newEnv(t, false)
	out := storePath("shared-out", "shared")
	first := buildPath(t, out, "first build")
	second := buildPath(t, out, "second, different build")
	j1 := job(t, e.pool, "one", out, "builder1")
	j2 := job(t, e.pool, "two", out, "builder1")

	e.uploadAll(t, nil, "", first)
	var r1 BuildCompleteResponse
	if code, body := e.post(t, "/api/build-complete", testToken, complete(j1, "", first.out), &r1); code != http.StatusOK || r1.Written != 1 {
		t.Fatalf("first build-complete: %d %s", code, body)
	}
	e.uploadAll(t, nil, "", second)
	var r2 BuildCompleteResponse
	if code, body := e.post(t, "/api/build-complete", testToken, complete(j2, "", second.out), &r2); code != http.StatusOK {
		t.Fatalf("second build-complete: %d %s", code, body)
	}
	if r2 != (BuildCompleteResponse{Conflicts: 1}) {
		t.Fatalf("second build-complete answered %+v, want one conflict", r2)
	}
	ni, _ := e.narInfo(t, out)
	if ni == nil || ni.NarHash != first.out.NarHash || ni.FileHash != first.out.FileHash {
		t.Fatalf("narinfo rewritten: %+v", ni)
	}
	for _, name := range []string{"one", "two"} {
		if h := outputHash(t, e.pool, name); h == nil || *h != first.out.NarHash {
			t.Fatalf("%s: nar_hash = %v, want the first %s", name, h, first.out.NarHash)
		}
	}
	if s := queuetest.Status(t, e.pool, "two"); s != "succeeded" {
		t.Fatalf("second job is %s, want succeeded", s)
	}
	// The identical result again is idempotent.
	var r3 BuildCompleteResponse
	if code, _ := e.post(t, "/api/build-complete", testToken, BuildCompleteRequest{Outputs: []Output{first.out}}, &r3); code != http.StatusOK || r3 != (BuildCompleteResponse{Skipped: 1}) {
		t.Fatalf("repeat: %d %+v", code, r3)
	}
}

func TestEvaluatorBatch(t *testing.T) {
	e := newEnv(t, false)
	var bs []built
	var outs []Output
	for i, name := range []string{"a.drv", "b.drv", "c.drv"} {
		p := storePath("drv-"+name, name)
		var refs []string
		if i > 0 {
			refs = []string{bs[i-1].out.StorePath} // full path, normalised to a basename
		}
		b := buildPath(t, p, "Derive("+name+")", refs...)
		bs = append(bs, b)
		outs = append(outs, b.out)
	}
	e.uploadAll(t, nil, "", bs...)
	var resp BuildCompleteResponse
	if code, body := e.post(t, "/api/build-complete", testToken, BuildCompleteRequest{Outputs: outs}, &resp); code != http.StatusOK {
		t.Fatalf("build-complete: %d %s", code, body)
	}
	if resp != (BuildCompleteResponse{Written: 3}) {
		t.Fatalf("answered %+v", resp)
	}
	for i, b := range bs {
		ni, ok := e.narInfo(t, b.out.StorePath)
		if !ok || !ni.Verify(e.key.Public()) {
			t.Fatalf("%s: narinfo missing or unsigned", b.out.StorePath)
		}
		if i > 0 && (len(ni.References) != 1 || ni.References[0] != strings.TrimPrefix(bs[i-1].out.StorePath, "/nix/store/")) {
			t.Fatalf("%s: references %v", b.out.StorePath, ni.References)
		}
	}
	if code, _ := e.post(t, "/api/build-complete", testToken, BuildCompleteRequest{Outputs: outs}, &resp); code != http.StatusOK || resp != (BuildCompleteResponse{Skipped: 3}) {
		t.Fatalf("repeat: %d %+v", code, resp)
	}
	var slots UploadSlotsResponse
	if code, _ := e.post(t, "/api/upload-slots", testToken, UploadSlotsRequest{Outputs: outs}, &slots); code != http.StatusOK {
		t.Fatal(code)
	}
	for _, s := range slots.Outputs {
		if !s.Skipped {
			t.Fatalf("%s not skipped after upload", s.StorePath)
		}
	}
}

func TestValidation(t *testing.T) {
	e := newEnv(t, false)
	good := buildPath(t, storePath("v", "v"), "v").out
	mod := func(f func(o *Output)) Output { o := good; f(&o); return o }
	cases := []struct {
		name string
		path string
		body any
		want string
	}{
		{"empty", "/api/upload-slots", UploadSlotsRequest{}, "outputs:"},
		{"store path", "/api/upload-slots", UploadSlotsRequest{Outputs: []Output{good, mod(func(o *Output) { o.StorePath = "/tmp/x" })}}, "outputs[1].store_path"},
		{"nar hash", "/api/upload-slots", UploadSlotsRequest{Outputs: []Output{mod(func(o *Output) { o.NarHash = "sha256:abc" })}}, "outputs[0].nar_hash"},
		{"file hash", "/api/upload-slots", UploadSlotsRequest{Outputs: []Output{mod(func(o *Output) { o.FileHash = "md5:x" })}}, "outputs[0].file_hash"},
		{"nar size", "/api/upload-slots", UploadSlotsRequest{Outputs: []Output{mod(func(o *Output) { o.NarSize = 0 })}}, "outputs[0].nar_size"},
		{"file size", "/api/upload-slots", UploadSlotsRequest{Outputs: []Output{mod(func(o *Output) { o.FileSize = -1 })}}, "outputs[0].file_size"},
		{"reference", "/api/build-complete", BuildCompleteRequest{Outputs: []Output{mod(func(o *Output) { o.References = []string{"nope"} })}}, "outputs[0].references[0]"},
		{"deriver", "/api/build-complete", BuildCompleteRequest{Outputs: []Output{mod(func(o *Output) { o.Deriver = "../x" })}}, "outputs[0].deriver"},
		{"log prefix", "/api/upload-slots", UploadSlotsRequest{Outputs: []Output{good}, Log: &LogUpload{Key: "nar/x", Size: 1, SHA256: strings.Repeat("0", 64)}}, "log.key"},
		{"log traversal", "/api/upload-slots", UploadSlotsRequest{Outputs: []Output{good}, Log: &LogUpload{Key: "log/../a.narinfo", Size: 1, SHA256: strings.Repeat("0", 64)}}, "log.key"},
		{"log sha", "/api/upload-slots", UploadSlotsRequest{Outputs: []Output{good}, Log: &LogUpload{Key: logKey("v"), Size: 1, SHA256: "zz"}}, "log.sha256"},
		{"not json", "/api/upload-slots", "just a string", "invalid JSON"},
	}
	for _, c := range cases {
		code, body := e.post(t, c.path, testToken, c.body, nil)
		if code != http.StatusBadRequest || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s, want 400 naming %s", c.name, code, body, c.want)
		}
	}
	// An oversized body is refused with 413.
	huge := UploadSlotsRequest{Outputs: []Output{mod(func(o *Output) { o.Deriver = strings.Repeat("x", MaxRequestBody) })}}
	if code, _ := e.post(t, "/api/upload-slots", testToken, huge, nil); code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d, want 413", code)
	}
	if n := countObjects(t, e.store); n != 0 {
		t.Fatalf("store has %d objects after invalid requests", n)
	}
}

// A failed build uploads its log alone: upload-slots with a log and no outputs hands out the
// log's URL, and the upload lands under the key.
func TestLogOnlySlots(t *testing.T) {
	e := newEnv(t, false)
	body := []byte("error: build failed\n")
	sum := sha256.Sum256(body)
	key := logKey("failed")
	var resp UploadSlotsResponse
	code, raw := e.post(t, "/api/upload-slots", testToken,
		UploadSlotsRequest{Log: &LogUpload{Key: key, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])}}, &resp)
	if code != http.StatusOK || resp.Log == nil || len(resp.Outputs) != 0 {
		t.Fatalf("log-only upload-slots: %d %s", code, raw)
	}
	put(t, resp.Log, body)
	if _, err := e.store.Head(context.Background(), key); err != nil {
		t.Fatalf("log not in the store after its upload: %v", err)
	}
}
