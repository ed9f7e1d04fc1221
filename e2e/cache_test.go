package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestPublishAndSubstitute is the binary cache end to end, on each blob store: real Nix builds a
// small DAG; every output (with its build log) and the .drv closure are published through a real
// signer node's upload-slots and build-complete; then a fresh Nix store substitutes all of it
// from the node's cache with signature checking, and refuses it under another key. Turned into a
// private project's, it is refused without credentials and substituted with a netrc-file.
func TestPublishAndSubstitute(t *testing.T) {
	requireNix(t)
	for _, backend := range []string{"local", "s3"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			testPublishAndSubstitute(t, backend)
		})
	}
}

func testPublishAndSubstitute(t *testing.T, backend string) {
	dir := t.TempDir()
	cfg, env, pub := signerConfig(t, dir, "e2e-cache-1", backend)
	f := newFixture(t, "")
	f.startSigners(cfg, env, dir, "signer-1")
	cacheURL := f.endpoint("signer-1")
	// A DAG real Nix builds: a; b <- a; c <- a, b. The marker makes every run's paths new.
	d, client := f.queueDAG(dir, signerclient.Config{GiveUpAfter: 30 * time.Second})
	ctx := context.Background()

	// The evaluator's part first: the .drv closure, published under the evaluation it holds.
	f.publishDAG(d)

	// Build order comes from the queue: each claim is ready only once its inputs succeeded.
	for range 3 {
		job := f.claimNext(d)
		name := d.nameOf(job.DrvPath)
		outPath := d.outputs[name]
		o, nar := publishable(t, outPath, job.DrvPath)
		logText := nixOut(t, "nix-store", "--read-log", job.DrvPath)
		logZst := zstdBytes(t, []byte(logText))
		sum := sha256.Sum256(logZst)
		logKey := "log/" + filepath.Base(job.DrvPath)
		claim := signerapi.JobClaim{ID: job.ID, Attempt: job.Attempt}
		slots, err := client.UploadSlots(ctx, signerapi.UploadSlotsRequest{Job: &claim, Outputs: []signerapi.Output{o},
			Log: &signerapi.LogUpload{Key: logKey, Size: int64(len(logZst)), SHA256: hex.EncodeToString(sum[:])}})
		if err != nil {
			t.Fatalf("upload-slots for %s: %v", name, err)
		}
		if slots.Outputs[0].Upload == nil {
			t.Fatalf("%s: no upload URL for a new output", name)
		}
		put(t, slots.Outputs[0].Upload, nar)
		put(t, slots.Log, logZst)
		if _, err := client.BuildComplete(ctx, signerapi.BuildCompleteRequest{Job: claim, Outputs: []signerapi.Output{o}, LogKey: logKey}); err != nil {
			t.Fatalf("build-complete for %s: %v", name, err)
		}
		var st status.JobStatus
		var logURL *string
		if err := f.pool.QueryRow(ctx, `SELECT status, log_url FROM build_jobs WHERE id = $1`, job.ID).Scan(&st, &logURL); err != nil {
			t.Fatal(err)
		}
		if st != status.JobSucceeded || logURL == nil || *logURL != logKey {
			t.Fatalf("%s: job is %s with log_url %v after build-complete", name, st, logURL)
		}
	}

	// A fresh store substitutes every output, and the .drv closure, checking signatures.
	trusted := pub
	store := t.TempDir()
	args := []string{"--store", store, "-r", d.outputs["c"], d.outputs["b"], d.outputs["a"],
		"--option", "substituters", cacheURL, "--option", "trusted-public-keys", trusted, "--option", "require-sigs", "true"}
	if out, err := exec.Command("nix-store", args...).CombinedOutput(); err != nil {
		t.Fatalf("nix-store -r from the cache: %v\n%s", err, out)
	}
	drvStore := t.TempDir()
	copyOut, err := exec.Command("nix", "--extra-experimental-features", "nix-command", "copy", "--derivation", "--from", cacheURL,
		"--to", drvStore, "--option", "trusted-public-keys", trusted, d.drvs["c"]).CombinedOutput()
	if err != nil {
		t.Fatalf("nix copy of the .drv closure from the cache: %v\n%s", err, copyOut)
	}
	for _, name := range []string{"a", "b", "c"} {
		if _, err := os.Stat(filepath.Join(drvStore, d.drvs[name])); err != nil {
			files, _ := exec.Command("find", drvStore, "-maxdepth", "4").CombinedOutput()
			t.Errorf("the .drv of %s did not arrive: %v\nnix copy said:\n%s\nstore:\n%s", name, err, copyOut, files)
		}
	}

	// Under another key, Nix refuses the same paths.
	other, err := nix.GenerateKey("e2e-cache-1")
	if err != nil {
		t.Fatal(err)
	}
	args = []string{"--store", t.TempDir(), "-r", d.outputs["a"], "--option", "substituters", cacheURL,
		"--option", "trusted-public-keys", other.Public().String(), "--option", "require-sigs", "true"}
	if out, err := exec.Command("nix-store", args...).CombinedOutput(); err == nil {
		t.Fatalf("a store trusting another key substituted from the cache:\n%s", out)
	}

	// The build log, decompressed for a client that does not ask for zstd.
	resp, err := http.Get(cacheURL + "/log/" + filepath.Base(d.drvs["c"]))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "building c") {
		t.Fatalf("GET /log/<c.drv>: %d %q", resp.StatusCode, body)
	}

	// The project turns private: a netrc-file with a cache token is needed.
	f.substitutePrivate(d, "private-"+backend, cacheURL, trusted)
}

func cmpOr(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

func requireNix(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nix-store"); err != nil {
		t.Fatal("nix-store not found: install the Debian package nix-bin (scripts/deps.sh test does)")
	}
}

// dag is a small DAG built with real Nix.
type dag struct {
	system  string
	drvs    map[string]string // name → .drv path
	outputs map[string]string // name → out path
}

func buildDAG(t *testing.T, dir string) dag {
	t.Helper()
	marker := fmt.Sprintf("%d", time.Now().UnixNano())
	expr := `let
  mk = name: deps: builtins.derivation {
    inherit name;
    marker = "` + marker + `";
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" "echo building ${name}; echo ${name} > $out; ${builtins.concatStringsSep ""
      (map (d: "while IFS= read -r l; do echo \"$l\" >> $out; done < ${d};") deps)}" ];
  };
  a = mk "a" [];  b = mk "b" [a];  c = mk "c" [a b];
in { inherit a b c; }`
	file := filepath.Join(dir, "dag.nix")
	if err := os.WriteFile(file, []byte(expr), 0o644); err != nil {
		t.Fatal(err)
	}
	d := dag{drvs: map[string]string{}, outputs: map[string]string{}}
	for _, name := range []string{"a", "b", "c"} {
		d.drvs[name] = strings.TrimSpace(nixOut(t, "nix-instantiate", file, "-A", name))
	}
	// Root runs single-user Nix here: no build users, and the /bin/sh builder needs the host's
	// /bin outside a sandbox.
	out := nixOut(t, "nix-store", "--realise", d.drvs["c"], d.drvs["b"], d.drvs["a"], "--option", "substituters", "",
		"--option", "build-users-group", "", "--option", "sandbox", "false")
	paths := strings.Fields(out)
	if len(paths) != 3 {
		t.Fatalf("nix-store --realise printed %q", out)
	}
	d.outputs["c"], d.outputs["b"], d.outputs["a"] = paths[0], paths[1], paths[2]
	d.system = strings.TrimSpace(nixOut(t, "nix-instantiate", "--eval", "--expr", "builtins.currentSystem", "--json"))
	d.system = strings.Trim(d.system, `"`)
	return d
}

func (d dag) nameOf(drv string) string {
	for n, p := range d.drvs {
		if p == drv {
			return n
		}
	}
	return ""
}

// derivation describes name's .drv for the queue, with its input derivations.
func (d dag) derivation(t *testing.T, name string) queue.Derivation {
	t.Helper()
	drv := d.drvs[name]
	narHash, narSize, err := nix.HashNAR(drv)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := nix.ParseStorePath(d.outputs[name])
	if err != nil {
		t.Fatal(err)
	}
	q := queue.Derivation{DrvPath: drv, Name: name, System: d.system, NarHash: narHash, NarSize: narSize,
		Outputs: []queue.Output{{Name: "out", Path: sp.String()}}}
	for _, ref := range strings.Fields(nixOut(t, "nix-store", "-q", "--references", drv)) {
		if strings.HasSuffix(ref, ".drv") {
			q.Inputs = append(q.Inputs, queue.Input{DrvPath: ref, Outputs: []string{"out"}})
		}
	}
	return q
}

// publishable compresses a store path as a builder would and describes it for the signer.
func publishable(t *testing.T, path, deriver string) (signerapi.Output, []byte) {
	t.Helper()
	var buf bytes.Buffer
	sizes, err := nix.CompressNAR(context.Background(), path, &buf)
	if err != nil {
		t.Fatal(err)
	}
	o := signerapi.Output{StorePath: path, NarHash: sizes.NarHash, NarSize: sizes.NarSize, FileHash: sizes.FileHash,
		FileSize: sizes.FileSize, References: strings.Fields(nixOut(t, "nix-store", "-q", "--references", path))}
	if deriver != "" {
		o.Deriver = filepath.Base(deriver)
	}
	return o, buf.Bytes()
}

func put(t *testing.T, u *signerapi.Upload, body []byte) {
	t.Helper()
	req, err := http.NewRequest(u.Method, u.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range u.Headers {
		if strings.EqualFold(k, "Content-Length") {
			continue
		}
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.ContentLength = int64(len(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("upload to %s: %d %s", u.URL, resp.StatusCode, msg)
	}
}

func zstdBytes(t *testing.T, b []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	return enc.EncodeAll(b, nil)
}

func nixOut(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, stderr.String())
	}
	return string(out)
}

// TestSignerFailover: two signer processes share a bucket and a key; one is killed with -9 in the
// middle of publishing, and the builder's uploads go on through the other, its claims intact.
func TestSignerFailover(t *testing.T) {
	requireNix(t)
	dir := t.TempDir()
	cfg, env, pub := signerConfig(t, dir, "e2e-failover-1", "s3")
	f := newFixture(t, "")
	f.startSigners(cfg, env, dir, "signer-1", "signer-2")
	d, client := f.queueDAG(dir, signerclient.Config{GiveUpAfter: 30 * time.Second, MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second})
	f.publishDAG(d)
	ctx := context.Background()

	for i := range 3 {
		if i == 1 {
			// The dead signer's row stays fresh for a while: the client must get past it.
			f.procs["signer-1"].Signal(t, syscall.SIGKILL)
			f.procs["signer-1"].Wait(t, 10*time.Second)
		}
		job := f.claimNext(d)
		o, nar := publishable(t, d.outputs[d.nameOf(job.DrvPath)], job.DrvPath)
		claim := signerapi.JobClaim{ID: job.ID, Attempt: job.Attempt}
		slots, err := client.UploadSlots(ctx, signerapi.UploadSlotsRequest{Job: &claim, Outputs: []signerapi.Output{o}})
		if err != nil {
			t.Fatalf("upload-slots (step %d): %v", i, err)
		}
		if slots.Outputs[0].Upload != nil {
			put(t, slots.Outputs[0].Upload, nar)
		}
		if _, err := client.BuildComplete(ctx, signerapi.BuildCompleteRequest{Job: claim, Outputs: []signerapi.Output{o}}); err != nil {
			t.Fatalf("build-complete (step %d): %v", i, err)
		}
	}
	var succeeded int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM build_jobs WHERE status = 'succeeded'`).Scan(&succeeded); err != nil {
		t.Fatal(err)
	}
	if succeeded != 3 {
		t.Fatalf("%d of 3 builds succeeded", succeeded)
	}
	// The survivor serves everything, including what the dead signer published.
	store := t.TempDir()
	args := []string{"--store", store, "-r", d.outputs["c"], "--option", "substituters", f.endpoint("signer-2"),
		"--option", "trusted-public-keys", pub, "--option", "require-sigs", "true"}
	if out, err := exec.Command("nix-store", args...).CombinedOutput(); err != nil {
		t.Fatalf("substitute from the surviving signer's cache: %v\n%s", err, out)
	}
}

// signerConfig writes a signing key and a node configuration for the signer
// and cache roles on backend ("local" or "s3"); it returns the configuration file, the
// environment the node needs, and the key's public half for trusted-public-keys.
func signerConfig(t *testing.T, dir, keyName, backend string) (cfg string, env []string, pub string) {
	t.Helper()
	keyFile := filepath.Join(dir, "signing-key")
	code, out := proctest.Run(t, nil, "keygen", "--name", keyName, "--secret-key-file", keyFile)
	if code != 0 {
		t.Fatalf("keygen: %s", out)
	}
	extra := fmt.Sprintf("[signer]\nsigning_key_file = %q\n", keyFile)
	if backend == "s3" {
		s3 := blobtest.StartMinIO(t)
		extra += fmt.Sprintf("[cache]\nstore = \"s3\"\n[cache.s3]\nendpoint = %q\nbucket = %q\nregion = %q\nuse_tls = false\npath_style = true\n",
			s3.Endpoint, s3.Bucket, cmpOr(s3.Region, "us-east-1"))
		env = []string{"HARMONIA_S3_ACCESS_KEY=" + s3.AccessKey, "HARMONIA_S3_SECRET_KEY=" + s3.SecretKey}
	} else {
		extra += fmt.Sprintf("[cache]\ndir = %q\n", filepath.Join(dir, "cache"))
	}
	return proctest.WriteFile(t, "node.toml", proctest.FastConfig+extra), env, strings.TrimSpace(out)
}

// startSigners runs signer-and-cache nodes with cfg and waits until they are active.
func (f *fixture) startSigners(cfg string, env []string, stateDir string, ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		f.procs[id] = proctest.Start(f.t, id, nodeEnv(f.t, env, id, "signer,cache"), "serve", "--config", cfg, "--database-url", f.dbURL,
			"--node-id", id, "--roles", "signer,cache", "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(stateDir, id))
	}
	for _, id := range ids {
		proctest.WaitFor(f.t, 30*time.Second, id+" active", func() bool { return f.nodeStatus(id) == status.NodeActive })
	}
}

// queueDAG builds the DAG with real Nix, enqueues its three jobs, registers builder-1 to claim
// them, and returns the DAG and a signer client such as a builder uses.
func (f *fixture) queueDAG(dir string, client signerclient.Config) (dag, *signerclient.Client) {
	t := f.t
	t.Helper()
	d := buildDAG(t, dir)
	ctx := context.Background()
	var ds []queue.Derivation
	for _, name := range []string{"a", "b", "c"} {
		ds = append(ds, d.derivation(t, name))
	}
	if _, err := queue.Enqueue(ctx, f.pool, queue.EnqueueParams{Derivations: ds}); err != nil {
		t.Fatal(err)
	}
	builder := cluster.NewRegistry(f.pool, cluster.NodeInfo{ID: "builder-1", Roles: []string{"builder"}, Endpoint: "http://builder.invalid",
		Systems: []string{d.system}, Features: []string{}, MaxJobs: 1, MaxEvals: 1}, slog.New(slog.DiscardHandler))
	if err := builder.Register(ctx); err != nil {
		t.Fatal(err)
	}
	client.Token = nodeToken(t, "builder-1", "builder")
	return d, signerclient.New(client, f.pool, slog.New(slog.DiscardHandler))
}

// publishDAG publishes d's .drv closure through a signer, under an evaluation evaluator-1 holds,
// as an evaluation does before it enqueues: the signer completes only jobs whose .drv it stored.
func (f *fixture) publishDAG(d dag) {
	t := f.t
	t.Helper()
	evalClient := signerclient.New(signerclient.Config{Token: nodeToken(t, "evaluator-1", "evaluator"), GiveUpAfter: 30 * time.Second},
		f.pool, slog.New(slog.DiscardHandler))
	var drvs []signerapi.DerivationText
	for _, name := range []string{"a", "b", "c"} { // inputs first
		text, err := os.ReadFile(d.drvs[name])
		if err != nil {
			t.Fatal(err)
		}
		drvs = append(drvs, signerapi.DerivationText{StorePath: d.drvs[name], Text: string(text)})
	}
	if _, err := evalClient.Publish(context.Background(), signerapi.PublishRequest{Eval: f.runningEvaluation("evaluator-1"), Derivations: drvs}); err != nil {
		t.Fatalf("publish .drv closure: %v", err)
	}
}

// claimNext claims builder-1's next ready job.
func (f *fixture) claimNext(d dag) queue.Job {
	f.t.Helper()
	jobs, err := queue.ClaimJobs(context.Background(), f.pool, queue.Claimer{NodeID: "builder-1", Systems: []string{d.system}}, 1)
	if err != nil || len(jobs) != 1 {
		f.t.Fatalf("claim: %v %v", jobs, err)
	}
	return jobs[0]
}

// runningEvaluation records an evaluation (of a project of its own) that node holds, running,
// as an evaluator that claimed it; it returns the claim.
func (f *fixture) runningEvaluation(node string) signerapi.EvalClaim {
	f.t.Helper()
	ctx := context.Background()
	var id int64
	err := f.pool.QueryRow(ctx, `
WITH r AS (INSERT INTO repositories (forge, owner, name, full_name, clone_url)
           VALUES ('git', '', $1, $1, '/nonexistent') RETURNING id),
     p AS (INSERT INTO projects (repo_id, name) SELECT id, $1 FROM r RETURNING id)
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at, attempt)
SELECT id, '/nonexistent', repeat('0', 40), 'main', 'running', $2, now(), now(), 1 FROM p
RETURNING id`, "evaluated-by-"+node, node).Scan(&id)
	if err != nil {
		f.t.Fatal(err)
	}
	return signerapi.EvalClaim{ID: id, Attempt: 1}
}
