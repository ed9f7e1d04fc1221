package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// The attacks of the issue "Trust zones that hold", replayed against real clusters with nothing
// but what an attacker would have: a builder's node token (and, as a compromised builder, the
// database), or a project the cluster evaluates and builds. Each attack must be refused (a 4xx,
// a failed attribute or build) and write nothing: the cache store is read object by object
// (NARs and logs decompressed) before and after and compared byte for byte, and no object and no
// database row may contain a secret of the cluster.

// attackCluster is front-1 (frontend, evaluator, signer and a local cache, with the cluster
// secret and the signing key in its state directory) and, if asked, b-sys: a builder in its
// default configuration on the system store, holding only its node token.
type attackCluster struct {
	*buildCluster
	state      string // front-1's state directory
	keyFile    string // front-1's signing key, 0600
	secretFile string // the cluster secret, 0600
	configFile string // front-1's configuration, world-readable, with a canary
	// secrets are texts no cache object and no database row may contain; cacheSecrets are texts
	// no cache object may contain.
	secrets, cacheSecrets []secretText
}

type secretText struct {
	what string
	text []byte
}

type attackOptions struct {
	builder bool   // start b-sys
	eval    string // [eval] settings of front-1 besides poll_interval
}

// attackNodeConfig is proctest.FastConfig with a dead threshold long enough that the builders
// an attacker registers from the test (which send no heartbeats) stay alive for the whole test.
func attackNodeConfig(t *testing.T) string {
	t.Helper()
	cfg := proctest.FastConfig
	for old, repl := range map[string]string{`dead_threshold = "1s"`: `dead_threshold = "2m"`, `dead_retention = "2s"`: `dead_retention = "1h"`} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("no %s in proctest.FastConfig to replace:\n%s", old, cfg)
		}
		cfg = strings.Replace(cfg, old, repl, 1)
	}
	return cfg + "[queue]\npoll_interval = \"1s\"\n"
}

func newAttackCluster(t *testing.T, o attackOptions) *attackCluster {
	t.Helper()
	requireNix(t)
	nixtest.RequireNix(t)
	f := newFixture(t, "")
	state := stateDir(t)
	keyFile := filepath.Join(state, "signing-key")
	code, out := proctest.Run(t, nil, "keygen", "--name", "e2e-attack-1", "--secret-key-file", keyFile)
	if code != 0 {
		t.Fatalf("keygen: %s", out)
	}
	pub := strings.TrimSpace(out)
	keyText, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	_, secretTxt, ok := strings.Cut(strings.TrimSpace(string(keyText)), ":")
	if !ok || secretTxt == "" {
		t.Fatalf("signing key file %q is not name:secret", keyText)
	}
	secretFile := filepath.Join(state, "cluster-secret")
	if err := os.WriteFile(secretFile, []byte(clusterSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The node's configuration file is world-readable, as configuration files often are
	// (one holding a database password must not be: the node refuses it), and carries a canary:
	// evaluated and built code must not read the node's files, readable or not.
	canary := "pw-" + randomHex(t, 12)
	configFile := filepath.Join(state, "harmonia-ci.toml")
	cfg := fmt.Sprintf("# canary %s\n", canary) +
		attackNodeConfig(t) +
		fmt.Sprintf("[auth]\ncluster_secret_file = %q\n[signer]\nsigning_key_file = %q\n[eval]\npoll_interval = \"500ms\"\n%s\n",
			secretFile, keyFile, o.eval)
	if err := os.WriteFile(configFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(configFile, 0o644); err != nil {
		t.Fatal(err)
	}

	c := &attackCluster{
		buildCluster: &buildCluster{fixture: f, nodeCfg: configFile, pub: pub, stores: map[string]string{},
			stopped: map[string]bool{}, project: "attack"},
		state: state, keyFile: keyFile, secretFile: secretFile, configFile: configFile,
	}
	// front-1 has its secrets in its environment too: what builtins.getEnv or /proc/self/environ
	// could leak.
	env := []string{"HARMONIA_CLUSTER_SECRET=" + clusterSecret, "HARMONIA_ADMIN_TOKEN=" + adminToken}
	c.procs["front-1"] = proctest.Start(t, "front-1", env, "serve", "--config", configFile, "--database-url", f.dbURL,
		"--node-id", "front-1", "--roles", "frontend,evaluator,signer,cache", "--listen", "127.0.0.1:0", "--state-dir", state)
	if o.builder {
		bcfg := proctest.WriteFile(t, "builder.toml", attackNodeConfig(t))
		c.procs["b-sys"] = proctest.Start(t, "b-sys", nodeEnv(t, nil, "b-sys", "builder"), "serve", "--config", bcfg,
			"--database-url", f.dbURL, "--node-id", "b-sys", "--roles", "builder", "--listen", "127.0.0.1:0",
			"--state-dir", filepath.Join(t.TempDir(), "state"))
		c.stores["b-sys"] = "" // the system store
	}
	for id := range c.procs {
		c.waitActive(id)
	}
	c.cacheURL = c.endpoint("front-1")
	c.cli = newCLI(t, f)
	c.repo = nixtest.NewRepo(t)
	c.cli.ok("project", "add", c.project, "--repo", c.repo.Dir)

	seed, err := base64.StdEncoding.DecodeString(secretTxt)
	if err != nil || len(seed) != 64 {
		t.Fatalf("signing key secret %q: %v", secretTxt, err)
	}
	c.secrets = []secretText{
		{"the signing key (as in its file)", []byte(secretTxt)},
		{"the signing key's seed", seed[:32]},
		{"the signing key's seed in hex", []byte(hex.EncodeToString(seed[:32]))},
		{"the cluster secret", []byte(clusterSecret)},
		{"the admin token", []byte(adminToken)},
		{"the canary in front-1's configuration", []byte(canary)},
	}
	for _, n := range []string{"b-sys", "evil-1", "victim-1"} {
		c.secrets = append(c.secrets, secretText{n + "'s node token", []byte(nodeToken(t, n, "builder"))})
	}
	c.cacheSecrets = []secretText{{"the database URL", []byte(f.dbURL)}}
	return c
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// cacheObjects reads every file of front-1's local cache store: key → content, decompressed
// when it is zstd (NARs, logs), and the .drv objects the database keeps. Temporary files count
// too: a refused upload leaves none.
func (c *attackCluster) cacheObjects() map[string][]byte {
	c.t.Helper()
	dir := filepath.Join(c.state, "cache")
	dec, err := zstd.NewReader(nil)
	if err != nil {
		c.t.Fatal(err)
	}
	defer dec.Close()
	objs := map[string][]byte{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s in the cache store is no regular file (%s)", rel, d.Type())
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.HasPrefix(b, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
			if b, err = dec.DecodeAll(b, nil); err != nil {
				return fmt.Errorf("decompress %s: %w", rel, err)
			}
		}
		objs[rel] = b
		return nil
	})
	if err != nil {
		c.t.Fatalf("read the cache store: %v", err)
	}
	// The .drv objects are kept in the database (blob.Derivations).
	ctx := context.Background()
	drvs := blob.NewDerivations(c.pool)
	err = drvs.List(ctx, func(d blob.DrvInfo) error {
		info, _, err := drvs.NarInfo(ctx, d.Hash)
		if err != nil {
			return err
		}
		nar, _, err := drvs.NAR(ctx, d.NarKey)
		if err != nil {
			return err
		}
		objs[d.NarInfoKey()], objs[d.NarKey] = info, nar
		return nil
	})
	if err != nil {
		c.t.Fatalf("read the cache's .drv objects: %v", err)
	}
	return objs
}

// checkPublished fails the test unless the cache's narinfos name exactly the store paths want.
func (c *attackCluster) checkPublished(want []string) {
	c.t.Helper()
	var have []string
	for k, b := range c.cacheObjects() {
		if !strings.HasSuffix(k, ".narinfo") {
			continue
		}
		ni, err := nix.ParseNarInfo(b)
		if err != nil {
			c.t.Fatalf("cache object %s: %v", k, err)
		}
		have = append(have, ni.StorePath)
	}
	slices.Sort(have)
	want = slices.Compact(slices.Sorted(slices.Values(want)))
	if !slices.Equal(have, want) {
		c.t.Errorf("the cache publishes %v, want exactly %v", have, want)
	}
}

// diffObjects lists the keys added, removed and changed from before to after.
func diffObjects(before, after map[string][]byte) (added, removed, changed []string) {
	for k, b := range after {
		a, ok := before[k]
		switch {
		case !ok:
			added = append(added, k)
		case !bytes.Equal(a, b):
			changed = append(changed, k)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			removed = append(removed, k)
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	slices.Sort(changed)
	return added, removed, changed
}

// checkUnchanged fails the test unless the cache store holds exactly before, byte for byte.
func (c *attackCluster) checkUnchanged(before map[string][]byte, what string) {
	c.t.Helper()
	added, removed, changed := diffObjects(before, c.cacheObjects())
	if len(added)+len(removed)+len(changed) > 0 {
		c.t.Errorf("%s changed the cache store: added %v, removed %v, changed %v", what, added, removed, changed)
	}
}

// databaseText is every row of every table of the cluster's database, as text, by table.
func (c *attackCluster) databaseText() map[string]string {
	c.t.Helper()
	ctx := context.Background()
	rows, err := c.pool.Query(ctx, `SELECT format('%I.%I', schemaname, tablename) FROM pg_tables
WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1`)
	if err != nil {
		c.t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	text := map[string]string{}
	for _, tbl := range tables {
		var s string
		// tbl is quoted by format('%I.%I') above.
		if err := c.pool.QueryRow(ctx, `SELECT COALESCE(string_agg(t::text, E'\n'), '') FROM `+tbl+` t`).Scan(&s); err != nil {
			c.t.Fatalf("read %s: %v", tbl, err)
		}
		text[tbl] = s
	}
	return text
}

// checkNoSecrets fails the test if a cache object (decompressed) or a database row contains a
// secret of the cluster, or one of extra.
func (c *attackCluster) checkNoSecrets(extra ...secretText) {
	c.t.Helper()
	secrets := append(slices.Clone(c.secrets), extra...)
	objs := c.cacheObjects()
	found := 0
	for _, k := range slices.Sorted(maps.Keys(objs)) {
		for _, s := range append(slices.Clone(secrets), c.cacheSecrets...) {
			if bytes.Contains(objs[k], s.text) {
				c.t.Errorf("cache object %s contains %s", k, s.what)
				found++
			}
		}
	}
	db := c.databaseText()
	for _, tbl := range slices.Sorted(maps.Keys(db)) {
		for _, s := range secrets {
			if strings.Contains(db[tbl], string(s.text)) {
				c.t.Errorf("database table %s contains %s", tbl, s.what)
				found++
			}
		}
	}
	if found == 0 {
		c.t.Logf("no secret in %d cache objects and %d database tables", len(objs), len(db))
	}
}

var attackHTTP = &http.Client{Timeout: 30 * time.Second}

// post sends body (a string as it is, anything else as JSON) to front-1's path with token as
// the bearer ("" for none); it returns the status and the response body.
func (c *attackCluster) post(token, path string, body any) (int, string) {
	c.t.Helper()
	b, ok := body.(string)
	if !ok {
		j, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		b = string(j)
	}
	req, err := http.NewRequest(http.MethodPost, c.cacheURL+path, strings.NewReader(b))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return sendRequest(c.t, req)
}

// putBlob PUTs body to u as a presigned upload would.
func putBlob(t *testing.T, u, contentType string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.ContentLength = int64(len(body))
	return sendRequest(t, req)
}

func sendRequest(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := attackHTTP.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.Join(strings.Fields(string(b)), " ")
}

// get returns the status of GET front-1's path.
func (c *attackCluster) get(path string) int {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.cacheURL+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	code, _ := sendRequest(c.t, req)
	return code
}

// narinfoStatus is the status of GET /<hash>.narinfo of store path p from front-1's cache.
func (c *attackCluster) narinfoStatus(p string) int {
	c.t.Helper()
	sp, err := nix.ParseStorePath(p)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.get("/" + sp.Hash + ".narinfo")
}

// refusal is one request an attacker sends, and how it must be refused.
type refusal struct {
	name  string
	token string
	path  string
	body  any
	want  int    // the status; 0 for any 4xx
	msg   string // part of the error message, "" for any
}

func (c *attackCluster) checkRefused(rs []refusal) {
	c.t.Helper()
	for _, r := range rs {
		code, body := c.post(r.token, r.path, r.body)
		switch {
		case r.want == 0 && (code < 400 || code > 499):
			c.t.Errorf("%s: POST %s answered %d %s, want a 4xx", r.name, r.path, code, body)
		case r.want != 0 && code != r.want:
			c.t.Errorf("%s: POST %s answered %d %s, want %d", r.name, r.path, code, body, r.want)
		case !strings.Contains(body, r.msg):
			c.t.Errorf("%s: POST %s answered %d %s, want a message containing %q", r.name, r.path, code, body, r.msg)
		default:
			c.t.Logf("%s: %d %s", r.name, code, body)
		}
	}
}

// blobURL is a local store upload URL for key on base, signed with mac key k over the format
// the handler signs: "PUT|<key>|<expires>|<size>|<sha256 hex>|<content type>".
func blobURL(base string, k []byte, key string, body []byte, expires time.Time) string {
	sum := sha256.Sum256(body)
	sumHex := hex.EncodeToString(sum[:])
	m := hmac.New(sha256.New, k)
	fmt.Fprintf(m, "%s|%s|%d|%d|%s|%s", http.MethodPut, key, expires.Unix(), len(body), sumHex, blob.ContentTypeFor(key))
	q := url.Values{}
	q.Set("expires", strconv.FormatInt(expires.Unix(), 10))
	q.Set("size", strconv.Itoa(len(body)))
	q.Set("sha256", sumHex)
	q.Set("sig", hex.EncodeToString(m.Sum(nil)))
	return base + "/api/blob/" + key + "?" + q.Encode()
}

// oldBlobKey is the key the local store's upload URLs were signed with before node tokens: the
// sha256 of a label and the token every node shared.
func oldBlobKey(token string) []byte {
	k := sha256.Sum256([]byte("harmonia-ci blob upload\x00" + token))
	return k[:]
}

// outputOf is the path of drv's output "out".
func (c *attackCluster) outputOf(drv string) string {
	c.t.Helper()
	var p string
	if err := c.pool.QueryRow(context.Background(),
		`SELECT output_path FROM derivation_outputs WHERE drv_path = $1 AND output_name = 'out'`, drv).Scan(&p); err != nil {
		c.t.Fatalf("output of %s: %v", drv, err)
	}
	return p
}

// fabricatedOutput is what a compromised builder uploads for path: any content it likes (a
// NAR of a file holding content), consistent with its own hashes.
func fabricatedOutput(t *testing.T, path, content string) (signerapi.Output, []byte) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "out")
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	s, err := nix.CompressNAR(context.Background(), file, &buf)
	if err != nil {
		t.Fatal(err)
	}
	return signerapi.Output{StorePath: path, NarHash: s.NarHash, NarSize: s.NarSize, FileHash: s.FileHash,
		FileSize: s.FileSize, References: []string{}}, buf.Bytes()
}

// forgedStorePath is a store path no derivation of the cluster has.
func forgedStorePath(t *testing.T, name string) string {
	t.Helper()
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return nix.StoreDir + "/" + nix.EncodeBase32(b) + "-" + name
}

// registerBuilder registers node id as a builder for system, from the test process: a node of
// the attacker's, or the builder it tries to rob.
func (c *attackCluster) registerBuilder(id, system string) {
	c.t.Helper()
	r := cluster.NewRegistry(c.pool, cluster.NodeInfo{ID: id, Roles: []string{"builder"}, Endpoint: "http://" + id + ".invalid",
		Systems: []string{system}, Features: []string{}, MaxJobs: 1, MaxEvals: 1}, slog.New(slog.DiscardHandler))
	if err := r.Register(context.Background()); err != nil {
		c.t.Fatal(err)
	}
}

// claim claims one ready job of system as node id, as a builder does in the database.
func (c *attackCluster) claim(id, system string) queue.Job {
	c.t.Helper()
	jobs, err := queue.ClaimJobs(context.Background(), c.pool, queue.Claimer{NodeID: id, Systems: []string{system}}, 1)
	if err != nil || len(jobs) != 1 {
		c.t.Fatalf("claim as %s: %v %v", id, jobs, err)
	}
	return jobs[0]
}

// logSlot asks for the upload of log text under the job claim with token and PUTs it.
func (c *attackCluster) uploadLog(token string, claim signerapi.JobClaim, drv, text string) *signerapi.Upload {
	c.t.Helper()
	z := zstdBytes(c.t, []byte(text))
	sum := sha256.Sum256(z)
	code, body := c.post(token, "/api/upload-slots", signerapi.UploadSlotsRequest{Job: &claim, Outputs: []signerapi.Output{},
		Log: &signerapi.LogUpload{Key: "log/" + filepath.Base(drv), Size: int64(len(z)), SHA256: hex.EncodeToString(sum[:])}})
	if code != http.StatusOK {
		c.t.Fatalf("log slot of job %d: %d %s", claim.ID, code, body)
	}
	var resp signerapi.UploadSlotsResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil || resp.Log == nil {
		c.t.Fatalf("log slot of job %d: %v %s", claim.ID, err, body)
	}
	put(c.t, resp.Log, z)
	return resp.Log
}

// TestAttackSignerRefusesForgedPublishing: a compromised builder, evil-1, holds its node token,
// the database and one claimed job A; victim-1 holds job B; job C is pending. Everything evil-1
// sends to publish what it did not build is refused with a 4xx and writes nothing: the old
// unclaimed build-complete, another job's outputs, references or deriver, another builder's
// claim, another job's log, upload-slots for any log but its own, upload URLs for the local
// store minted the old way or re-pointed at another key, forged tokens. None of the forged paths
// becomes substitutable by real Nix. Then evil-1 completes its own job A, which is accepted (a
// compromised builder can publish a wrong but self-consistent output of the job it holds, no
// more): exactly A's narinfo is added.
func TestAttackSignerRefusesForgedPublishing(t *testing.T) {
	t.Parallel()
	c := newAttackCluster(t, attackOptions{})
	const system = "hci-attack" // no running builder claims these jobs: the attacker does
	salt := uniqueSalt(t)
	e := c.evaluate(`let
  foreign = name: builtins.derivation {
    inherit name;
    salt = "` + salt + `";
    system = "` + system + `";
    builder = "/bin/sh";
    args = [ "-c" "echo ${name} > $out" ];
  };
in { a = foreign "a"; b = foreign "b"; c = foreign "c"; }
`)
	ctx := context.Background()
	c.registerBuilder("evil-1", system)
	c.registerBuilder("victim-1", system)
	evil, victim := nodeToken(t, "evil-1", "builder"), nodeToken(t, "victim-1", "builder")
	jobA := c.claim("evil-1", system)
	jobB := c.claim("victim-1", system)
	var drvC string
	for _, a := range e.Attrs {
		if a.DrvPath != jobA.DrvPath && a.DrvPath != jobB.DrvPath {
			drvC = a.DrvPath
		}
	}
	if drvC == "" || c.job(drvC).Status != status.JobPending {
		t.Fatalf("evaluation %d: want a third job pending besides %s and %s: %+v", e.ID, jobA.DrvPath, jobB.DrvPath, e.Attrs)
	}
	jobC := c.job(drvC)
	claimA := signerapi.JobClaim{ID: jobA.ID, Attempt: jobA.Attempt}
	claimB := signerapi.JobClaim{ID: jobB.ID, Attempt: jobB.Attempt}
	outA, outB, outC := c.outputOf(jobA.DrvPath), c.outputOf(jobB.DrvPath), c.outputOf(drvC)
	forged := forgedStorePath(t, "evil")

	// What evil-1 may legitimately do first: upload a NAR for its own job's output (any content:
	// the signer cannot tell) and its log; victim-1 uploads its log. All before the snapshot.
	oA, narA := fabricatedOutput(t, outA, "evil-1 was here "+salt)
	code, body := c.post(evil, "/api/upload-slots", signerapi.UploadSlotsRequest{Job: &claimA, Outputs: []signerapi.Output{oA}})
	var slots signerapi.UploadSlotsResponse
	if code != http.StatusOK || json.Unmarshal([]byte(body), &slots) != nil || len(slots.Outputs) != 1 || slots.Outputs[0].Upload == nil {
		t.Fatalf("upload-slots for evil-1's own job: %d %s", code, body)
	}
	narUpload := slots.Outputs[0].Upload
	put(t, narUpload, narA)
	logA := c.uploadLog(evil, claimA, jobA.DrvPath, "building a\n")
	c.uploadLog(victim, claimB, jobB.DrvPath, "building b\n")

	before := c.cacheObjects()
	narKeyA := nix.NarURL(oA.FileHash)
	if _, ok := before[narKeyA]; !ok {
		t.Fatalf("evil-1's NAR %s is not in the cache store: %v", narKeyA, slices.Sorted(maps.Keys(before)))
	}
	withPath := func(o signerapi.Output, p string) signerapi.Output { o.StorePath = p; return o }
	withRefs := func(o signerapi.Output, refs ...string) signerapi.Output { o.References = refs; return o }
	withDeriver := func(o signerapi.Output, d string) signerapi.Output { o.Deriver = d; return o }
	complete := func(claim signerapi.JobClaim, logKey string, outs ...signerapi.Output) signerapi.BuildCompleteRequest {
		return signerapi.BuildCompleteRequest{Job: claim, Outputs: outs, LogKey: logKey}
	}
	logSlot := func(claim *signerapi.JobClaim, key string) signerapi.UploadSlotsRequest {
		sum := sha256.Sum256([]byte("log"))
		return signerapi.UploadSlotsRequest{Job: claim, Outputs: []signerapi.Output{},
			Log: &signerapi.LogUpload{Key: key, Size: 3, SHA256: hex.EncodeToString(sum[:])}}
	}
	oldOutput := map[string]any{"store_path": forged, "nar_hash": oA.NarHash, "nar_size": oA.NarSize,
		"file_hash": oA.FileHash, "file_size": oA.FileSize, "references": []string{forged, outB}}
	mac := evil[strings.LastIndexByte(evil, ':')+1:]
	otherCluster, err := nodetoken.NewKey("a-guess-at-the-cluster-secret")
	if err != nil {
		t.Fatal(err)
	}
	guessed, err := otherCluster.Issue(nodetoken.Identity{NodeID: "victim-1", Roles: []string{"builder"}})
	if err != nil {
		t.Fatal(err)
	}
	noJobDrv := filepath.Base(forgedStorePath(t, "no-job.drv"))

	c.checkRefused([]refusal{
		// 1. The old format: no claim, any store path and references, a node id in the body.
		{"old build-complete naming b-sys", evil, "/api/build-complete",
			map[string]any{"node_id": "b-sys", "outputs": []any{oldOutput}}, 0, ""},
		{"old build-complete naming evil-1", evil, "/api/build-complete",
			map[string]any{"node_id": "evil-1", "outputs": []any{oldOutput}}, 0, ""},
		{"old upload-slots", evil, "/api/upload-slots",
			map[string]any{"node_id": "evil-1", "outputs": []any{oldOutput}}, http.StatusBadRequest, ""},
		// With its claim on A: nothing but A's outputs, deriver and references.
		{"job A completed with job B's output", evil, "/api/build-complete",
			complete(claimA, "", withPath(oA, outB)), http.StatusBadRequest, "is not an output of"},
		{"job A completed with a forged path besides its output", evil, "/api/build-complete",
			complete(claimA, "", oA, withPath(oA, forged)), http.StatusBadRequest, "is not an output of"},
		{"job A's output with job B's deriver", evil, "/api/build-complete",
			complete(claimA, "", withDeriver(oA, filepath.Base(jobB.DrvPath))), http.StatusBadRequest, "deriver"},
		{"job A's output referring to job B's output", evil, "/api/build-complete",
			complete(claimA, "", withRefs(oA, outB)), http.StatusBadRequest, "references"},
		{"job A's output referring to B's .drv (in the cache, not in A's closure)", evil, "/api/build-complete",
			complete(claimA, "", withRefs(oA, jobB.DrvPath)), http.StatusBadRequest, "references"},
		{"job A's output referring to a forged path", evil, "/api/build-complete",
			complete(claimA, "", withRefs(oA, forged)), http.StatusBadRequest, "references"},
		{"upload-slots under job A for job B's output", evil, "/api/upload-slots",
			signerapi.UploadSlotsRequest{Job: &claimA, Outputs: []signerapi.Output{withPath(oA, outB)}}, http.StatusBadRequest, "is not an output of"},
		// Another builder's claim, a pending job, a claim's next attempt.
		{"job B (victim-1's) completed by evil-1", evil, "/api/build-complete",
			complete(claimB, "", withPath(oA, outB)), http.StatusConflict, ""},
		{"upload-slots under job B (victim-1's)", evil, "/api/upload-slots",
			signerapi.UploadSlotsRequest{Job: &claimB, Outputs: []signerapi.Output{withPath(oA, outB)}}, http.StatusConflict, ""},
		{"pending job C completed", evil, "/api/build-complete",
			complete(signerapi.JobClaim{ID: jobC.ID, Attempt: jobC.Attempt}, "", withPath(oA, outC)), http.StatusConflict, ""},
		{"pending job C completed as its next attempt", evil, "/api/build-complete",
			complete(signerapi.JobClaim{ID: jobC.ID, Attempt: jobC.Attempt + 1}, "", withPath(oA, outC)), http.StatusConflict, ""},
		{"job A completed under an attempt evil-1 does not hold", evil, "/api/build-complete",
			complete(signerapi.JobClaim{ID: jobA.ID, Attempt: jobA.Attempt + 1}, "", oA), http.StatusConflict, ""},
		// Another job's log: B's (uploaded by victim-1), or any other key.
		{"job A completed with job B's log", evil, "/api/build-complete",
			complete(claimA, "log/"+filepath.Base(jobB.DrvPath), oA), http.StatusBadRequest, "log_key"},
		{"job A completed with a narinfo as its log", evil, "/api/build-complete",
			complete(claimA, outA[len(nix.StoreDir)+1:len(nix.StoreDir)+33]+".narinfo", oA), http.StatusBadRequest, "log_key"},
		{"job A completed with its NAR as its log", evil, "/api/build-complete",
			complete(claimA, narKeyA, oA), http.StatusBadRequest, "log_key"},
		// 3. upload-slots for any log but the claim's own.
		{"log slot under job A for job B's drv", evil, "/api/upload-slots",
			logSlot(&claimA, "log/"+filepath.Base(jobB.DrvPath)), http.StatusBadRequest, "log.key"},
		{"log slot under job A for pending job C's drv", evil, "/api/upload-slots",
			logSlot(&claimA, "log/"+filepath.Base(drvC)), http.StatusBadRequest, "log.key"},
		{"log slot under job A for a drv with no job", evil, "/api/upload-slots",
			logSlot(&claimA, "log/"+noJobDrv), http.StatusBadRequest, "log.key"},
		{"log slot under job A for a narinfo key", evil, "/api/upload-slots",
			logSlot(&claimA, outA[len(nix.StoreDir)+1:len(nix.StoreDir)+33]+".narinfo"), http.StatusBadRequest, "log.key"},
		{"log slot under job B (victim-1's)", evil, "/api/upload-slots",
			logSlot(&claimB, "log/"+filepath.Base(jobB.DrvPath)), http.StatusConflict, ""},
		{"log slot without a claim", evil, "/api/upload-slots",
			logSlot(nil, "log/"+filepath.Base(jobB.DrvPath)), http.StatusBadRequest, ""},
		// A builder's token is no evaluator's, and no token stretches to another node or role.
		{"publish with a builder's token", evil, "/api/publish",
			signerapi.PublishRequest{Eval: signerapi.EvalClaim{ID: 1, Attempt: 1}, Sources: []signerapi.Output{withPath(oA, forged)}}, http.StatusForbidden, ""},
		{"evil-1's mac on victim-1's name", "hci1:victim-1:builder:" + mac, "/api/build-complete",
			complete(claimB, "", withPath(oA, outB)), http.StatusUnauthorized, ""},
		{"evil-1's mac with the signer role added", "hci1:evil-1:builder,signer:" + mac, "/api/build-complete",
			complete(claimA, "", oA), http.StatusUnauthorized, ""},
		{"a token under a guessed cluster secret", guessed, "/api/build-complete",
			complete(claimB, "", withPath(oA, outB)), http.StatusUnauthorized, ""},
		{"no token", "", "/api/build-complete", complete(claimA, "", oA), http.StatusUnauthorized, ""},
	})

	// 2. The local store's upload handler: URLs minted the old way (keyed by the token the
	// attacker holds), or by the token through the new derivation, or a real URL of evil-1's
	// re-pointed at another key, for an existing narinfo, a NAR and another job's log.
	// Job A's .drv, published by the evaluator (kept in the database: a narinfo written into the
	// store under its name would show in the comparison below).
	infoKey := filepath.Base(jobA.DrvPath)[:32] + ".narinfo"
	if code := c.narinfoStatus(jobA.DrvPath); code != http.StatusOK {
		t.Fatalf("GET the narinfo %s of the evaluated .drv: %d, want 200", infoKey, code)
	}
	attackerKey, err := nix.GenerateKey("e2e-attack-1")
	if err != nil {
		t.Fatal(err)
	}
	ni := nix.NewNarInfo(jobA.DrvPath, nix.Sizes{NarHash: oA.NarHash, NarSize: oA.NarSize, FileHash: oA.FileHash, FileSize: oA.FileSize}, nil)
	if err := ni.Sign(attackerKey); err != nil {
		t.Fatal(err)
	}
	forgedInfo, err := ni.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	forgedNAR := zstdBytes(t, []byte("not a NAR "+salt))
	forgedNARKey := nix.NarURL(nix.FormatSHA256(sha256.Sum256(forgedNAR)))
	forgedLog := zstdBytes(t, []byte("a forged log "+salt))
	logB := "log/" + filepath.Base(jobB.DrvPath)
	soon := time.Now().Add(10 * time.Minute)
	repoint := func(u *signerapi.Upload, key string) string {
		p, err := url.Parse(u.URL)
		if err != nil {
			t.Fatal(err)
		}
		p.Path = "/api/blob/" + key
		return p.String()
	}
	for _, b := range []struct {
		name, url, key string
		body           []byte
		want           int
	}{
		{"old-style URL for an existing narinfo", blobURL(c.cacheURL, oldBlobKey(evil), infoKey, forgedInfo, soon), infoKey, forgedInfo, http.StatusForbidden},
		{"old-style URL for a NAR", blobURL(c.cacheURL, oldBlobKey(evil), forgedNARKey, forgedNAR, soon), forgedNARKey, forgedNAR, http.StatusForbidden},
		{"old-style URL for job B's log", blobURL(c.cacheURL, oldBlobKey(evil), logB, forgedLog, soon), logB, forgedLog, http.StatusForbidden},
		{"old-style URL valid for a year", blobURL(c.cacheURL, oldBlobKey(evil), infoKey, forgedInfo, time.Now().AddDate(1, 0, 0)), infoKey, forgedInfo, http.StatusForbidden},
		{"URL keyed by the token as the cluster secret", blobURL(c.cacheURL, nodetoken.Derive(evil, "blob upload"), infoKey, forgedInfo, soon), infoKey, forgedInfo, http.StatusForbidden},
		{"evil-1's log URL re-pointed at a narinfo", repoint(logA, infoKey), infoKey, forgedInfo, http.StatusForbidden},
		{"evil-1's log URL re-pointed at job B's log", repoint(logA, logB), logB, forgedLog, http.StatusForbidden},
		{"evil-1's NAR URL with other bytes", narUpload.URL, narKeyA, bytes.Repeat([]byte{'x'}, len(narA)), http.StatusBadRequest},
	} {
		code, body := putBlob(t, b.url, blob.ContentTypeFor(b.key), b.body)
		if code != b.want {
			t.Errorf("2. %s: PUT answered %d %s, want %d", b.name, code, body, b.want)
		} else {
			t.Logf("2. %s: %d %s", b.name, code, body)
		}
	}

	// Nothing was written: the store byte for byte, the jobs as they were, no canonical hash.
	c.checkUnchanged(before, "the refused attacks")
	for _, w := range []struct {
		drv     string
		status  status.JobStatus
		by      string
		attempt int
	}{{jobA.DrvPath, status.JobBuilding, "evil-1", jobA.Attempt}, {jobB.DrvPath, status.JobBuilding, "victim-1", jobB.Attempt}, {drvC, status.JobPending, "", jobC.Attempt}} {
		if j := c.job(w.drv); j.Status != w.status || j.ClaimedBy != w.by || j.Attempt != w.attempt || j.LogURL != "" {
			t.Errorf("after the attacks: %s; want %s by %q, attempt %d, no log", j, w.status, w.by, w.attempt)
		}
	}
	var hashed int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM derivation_outputs WHERE output_path = ANY($1) AND nar_hash IS NOT NULL`,
		[]string{outA, outB, outC, forged}).Scan(&hashed); err != nil {
		t.Fatal(err)
	}
	if hashed != 0 {
		t.Errorf("%d canonical NAR hashes recorded by refused requests", hashed)
	}
	// Real Nix substitutes none of the paths the attacker tried to publish.
	for _, p := range []string{forged, outB, outC, outA} {
		if code := c.narinfoStatus(p); code != http.StatusNotFound {
			t.Errorf("GET the narinfo of %s: %d, want 404", p, code)
		}
		if out, err := c.substitute(c.pub, p); err == nil {
			t.Errorf("a fresh store substituted %s from the cache:\n%s", p, out)
		}
	}
	c.checkNoSecrets()
	if t.Failed() {
		t.FailNow()
	}

	// The control: evil-1 completes its own job with its own output and log, which the trust
	// model accepts. Exactly one narinfo is added, and only then is A's output substitutable.
	code, body = c.post(evil, "/api/build-complete", complete(claimA, "log/"+filepath.Base(jobA.DrvPath), oA))
	if code != http.StatusOK {
		t.Fatalf("evil-1's build-complete of its own job A: %d %s", code, body)
	}
	added, removed, changed := diffObjects(before, c.cacheObjects())
	wantInfo := outA[len(nix.StoreDir)+1:len(nix.StoreDir)+33] + ".narinfo"
	if !slices.Equal(added, []string{wantInfo}) || len(removed)+len(changed) != 0 {
		t.Errorf("completing job A: added %v, removed %v, changed %v; want exactly %s added", added, removed, changed, wantInfo)
	}
	if j := c.job(jobA.DrvPath); j.Status != status.JobSucceeded || j.LogURL != "log/"+filepath.Base(jobA.DrvPath) {
		t.Errorf("after completing job A: %s", j)
	}
	c.checkSubstitutable([]string{outA})
	for _, p := range []string{forged, outB, outC} {
		if out, err := c.substitute(c.pub, p); err == nil {
			t.Errorf("after job A: a fresh store substituted %s from the cache:\n%s", p, out)
		}
	}
}

// TestAttackEvaluationReadsSecrets: a project whose attributes read the evaluating node's
// secrets (its signing key and cluster secret by path, /proc/self/environ, builtins.getEnv), its
// world-readable configuration file, another project's source, through builtins.readFile,
// builtins.fetchurl (with a URL under the project's own source that climbs out of it),
// builtins.fetchGit, or a build imported from a derivation. Each of those attributes fails to
// evaluate, the project's other attributes evaluate and are published, and no cache object and
// no database row contains any of it.
func TestAttackEvaluationReadsSecrets(t *testing.T) {
	t.Parallel()
	c := newAttackCluster(t, attackOptions{})
	salt := uniqueSalt(t)
	ctx := context.Background()

	// Another project, with a file only its own evaluations may read, evaluated first so its
	// source copy is on front-1.
	private := "private-" + randomHex(t, 12)
	other := nixtest.NewRepo(t)
	other.Commit("private", map[string]string{"ci.nix": nixtest.Lib(salt+"-private") + "\n{ x = mk \"x\" [ ]; }", "secret.txt": private + "\n"})
	c.cli.ok("project", "add", "private", "--repo", other.Dir)
	var done evalJSON
	c.cli.json(&done, "eval", "private", "--wait", "--json")
	if done.Status != status.EvalSucceeded {
		t.Fatalf("evaluation of the private project: %s (%s)", done.Status, done.Error)
	}
	projectID := func(name string) int64 {
		var id int64
		if err := c.pool.QueryRow(ctx, `SELECT id FROM projects WHERE name = $1`, name).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// The source the attacking project's code is confined to, as the evaluator lays it out.
	source := filepath.Join(c.state, "eval", strconv.FormatInt(projectID(c.project), 10), "source.git")
	otherSource := fmt.Sprintf("%s/../../%d/source.git", source, projectID("private"))
	climb := source + "/../../.." // the state directory, through the source

	attacks := map[string]string{
		"keyReadFile":      `builtins.readFile "` + c.keyFile + `"`,
		"secretReadFile":   `builtins.readFile "` + c.secretFile + `"`,
		"configReadFile":   `builtins.readFile "` + c.configFile + `"`,
		"environ":          `builtins.readFile "/proc/self/environ"`,
		"climbingPath":     `builtins.readFile "` + climb + `/signing-key"`,
		"keyFetchurl":      `builtins.readFile (builtins.fetchurl "file://` + climb + `/signing-key")`,
		"configFetchurl":   `builtins.readFile (builtins.fetchurl "file://` + climb + `/harmonia-ci.toml")`,
		"otherFetchurl":    `builtins.readFile (builtins.fetchurl "file://` + otherSource + `/config")`,
		"otherFetchGit":    `builtins.readFile ((builtins.fetchGit { url = "file://` + otherSource + `"; ref = "main"; }) + "/secret.txt")`,
		"keyImportFromDrv": `import (sh "read-key" ''if { read -r l || [ -n "$l" ]; } < ` + c.keyFile + `; then echo "\"$l\"" > $out; else echo "no key"; exit 1; fi'')`,
	}
	names := slices.Sorted(maps.Keys(attacks))
	var b strings.Builder
	b.WriteString(shPrelude(salt) + `
  drv = name: value: builtins.derivation {
    inherit name salt;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" "echo ${name} > $out" ];
    leak = value;
  };
in {
  good = sh "good" "echo good > $out";
  alsoGood = sh "also-good" "echo also good > $out";
  getEnv = drv "get-env" (builtins.getEnv "HARMONIA_CLUSTER_SECRET" + builtins.getEnv "HARMONIA_ADMIN_TOKEN");
`)
	for _, n := range names {
		fmt.Fprintf(&b, "  %s = drv %q (%s);\n", n, strings.ToLower(n), attacks[n])
	}
	b.WriteString("}\n")
	c.repo.Commit("attack", map[string]string{"ci.nix": b.String()})
	code, out := c.cli.run("eval", c.project, "--wait", "--json")
	var e evalJSON
	decodeJSONOutput(t, out, &e)
	if code != 0 || e.Status != status.EvalSucceeded {
		t.Fatalf("evaluation %d: exit %d, %s (%s)\n%s", e.ID, code, e.Status, e.Error, out)
	}
	attrs := map[string]struct{ drv, err string }{}
	for _, a := range e.Attrs {
		attrs[a.Attr] = struct{ drv, err string }{a.DrvPath, a.Error}
	}
	for _, n := range []string{"good", "alsoGood", "getEnv"} {
		a, ok := attrs[n]
		if !ok || a.drv == "" || a.err != "" {
			t.Errorf("attribute %s: %+v; want it evaluated", n, a)
			continue
		}
		sp, _ := nix.ParseStorePath(a.drv)
		if code := c.get("/" + sp.Hash + ".narinfo"); code != http.StatusOK {
			t.Errorf("the .drv of %s, %s, is not in the cache: GET its narinfo %d", n, a.drv, code)
		}
	}
	for _, n := range names {
		a, ok := attrs[n]
		switch {
		case !ok:
			t.Errorf("attribute %s (%s) is not in the evaluation's attributes", n, attacks[n])
		case a.drv != "" || a.err == "":
			t.Errorf("attribute %s (%s) evaluated to %s: the project's code read outside its source", n, attacks[n], a.drv)
		default:
			t.Logf("%s refused: %s", n, errorLine(a.err))
		}
	}
	// Published: the .drv files of the attributes that evaluated (none has a source), nothing of
	// the refused ones. builtins.getEnv is "": the getEnv attribute's .drv holds no secret.
	c.checkPublished([]string{drvOf(t, done, "x"), attrs["good"].drv, attrs["alsoGood"].drv, attrs["getEnv"].drv})
	c.checkNoSecrets(secretText{"the private project's file", []byte(private)})
}

// TestAttackBuildReadsSecrets: a builder in its default configuration on the system store builds
// a project whose derivations read the node's signing key, its cluster secret and its
// world-readable configuration file with shell builtins, and dump every process's environment
// and command line they can see. The reading builds fail (the sandbox has none of those files),
// their outputs are never published, their logs (served by the cache) show the attempt and not
// the secret; the rest builds and is substitutable; no cache object and no database row holds a
// secret, the node's token or the database URL.
func TestAttackBuildReadsSecrets(t *testing.T) {
	t.Parallel()
	c := newAttackCluster(t, attackOptions{builder: true})
	steal := map[string]string{
		"signingKey":    c.keyFile,
		"clusterSecret": c.secretFile,
		"config":        c.configFile,
	}
	var b strings.Builder
	b.WriteString(shPrelude(uniqueSalt(t)) + `
  steal = name: file: sh name ''
    echo "stealing ${file}"
    if { read -r l || [ -n "$l" ]; } < ${file}; then echo "stole: $l"; echo "$l" > $out; else echo "could not read ${file}"; exit 1; fi
  '';
in {
  good = sh "good" "echo good > $out";
  procs = sh "procs" ''
    for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
      if [ -r "$f" ]; then while IFS= read -r l || [ -n "$l" ]; do echo "$f: $l"; done < "$f"; fi
    done
    set
    echo dumped > $out
  '';
`)
	names := slices.Sorted(maps.Keys(steal))
	for _, n := range names {
		fmt.Fprintf(&b, "  %s = steal %q %q;\n", n, strings.ToLower(n), steal[n])
	}
	b.WriteString("}\n")
	e := c.evaluate(b.String())
	jobs := c.waitFinished(e.ID, 90*time.Second)
	if len(jobs) != len(e.Attrs) {
		t.Fatalf("%d jobs for %d attributes", len(jobs), len(e.Attrs))
	}
	for _, n := range []string{"good", "procs"} {
		j := c.job(drvOf(t, e, n))
		if j.Status != status.JobSucceeded || j.ClaimedBy != "b-sys" {
			t.Errorf("%s: %s; want succeeded on b-sys", n, j)
			continue
		}
		c.checkSubstitutable(c.outputPaths([]jobRow{j}))
	}
	// The dump saw its own process alone, as pid 1 of the sandbox's PID namespace.
	dump := c.fetchLog(c.job(drvOf(t, e, "procs")))
	pids := map[string]bool{}
	for _, m := range procPathRE.FindAllStringSubmatch(dump, -1) {
		pids[m[1]] = true
	}
	if !pids["1"] || len(pids) != 1 {
		t.Errorf("the procs build saw %d processes, want only its own, pid 1:\n%s", len(pids), lastLines(dump, 30))
	}
	for _, n := range names {
		j := c.job(drvOf(t, e, n))
		if j.Status != status.JobFailed || j.ClaimedBy != "b-sys" {
			t.Errorf("%s (reads %s): %s; want failed on b-sys", n, steal[n], j)
			continue
		}
		out := c.outputPaths([]jobRow{j})[0]
		if code := c.narinfoStatus(out); code != http.StatusNotFound {
			t.Errorf("%s: GET the narinfo of its output %s: %d, want 404", n, out, code)
		}
		if o, err := c.substitute(c.pub, out); err == nil {
			t.Errorf("%s: a fresh store substituted its output %s:\n%s", n, out, o)
		}
		if log := c.fetchLog(j); !strings.Contains(log, "could not read "+steal[n]) || strings.Contains(log, "stole:") {
			t.Errorf("%s: its log does not show a refused read:\n%s", n, lastLines(log, 10))
		} else {
			t.Logf("%s failed: %s", n, errorLine(log))
		}
	}
	// Published: every .drv, and the outputs of the two builds that succeeded.
	var want []string
	for _, a := range e.Attrs {
		want = append(want, a.DrvPath)
	}
	for _, n := range []string{"good", "procs"} {
		want = append(want, c.outputPaths([]jobRow{c.job(drvOf(t, e, n))})...)
	}
	c.checkPublished(want)
	c.checkNoSecrets()
}

var procPathRE = regexp.MustCompile(`(?m)^/proc/([0-9]+)/(?:environ|cmdline): `)

// TestAttackEvalTimeoutCapped: a project asks for eval-timeout = "10h" in .harmonia-ci.toml
// and evaluates forever; the node's [eval] timeout of 3s still ends it: the evaluation fails as
// timed out after 3s, and its Nix (the evaluation user's) is gone.
func TestAttackEvalTimeoutCapped(t *testing.T) {
	t.Parallel()
	c := newAttackCluster(t, attackOptions{eval: `timeout = "3s"`})
	c.repo.Commit("slow", map[string]string{
		".harmonia-ci.toml": "eval-timeout = \"10h\"\n",
		// About a billion additions over lists of a thousand: minutes of CPU, within the memory
		// Nix's evaluator takes at start (about 450 MB).
		"ci.nix": `let
  n = builtins.genList (i: i) 1000;
  sum = l: builtins.foldl' (a: b: a + b) 0 l;
  burn = builtins.foldl' (a: i: a + builtins.foldl' (b: j: b + sum n) 0 n) 0 n;
in {
  slow = builtins.derivation {
    name = "slow";
    salt = "` + uniqueSalt(t) + `";
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" "echo ${toString burn} > $out" ];
  };
}
`})
	code, out := c.cli.run("eval", c.project, "--wait", "--json")
	var e evalJSON
	decodeJSONOutput(t, out, &e)
	if code == 0 || e.Status != status.EvalFailed || !strings.Contains(e.Error, "timed out after 3s") {
		t.Fatalf("evaluation %d: exit %d, %s (%s); want failed, timed out after the node's 3s\n%s", e.ID, code, e.Status, e.Error, out)
	}
	if e.StartedAt == nil || e.FinishedAt == nil || e.FinishedAt.Sub(*e.StartedAt) > 30*time.Second {
		t.Errorf("evaluation %d ran from %v to %v; want it ended soon after 3s", e.ID, e.StartedAt, e.FinishedAt)
	}
	// The killed walk leaves no Nix of the evaluation user behind in this node's workspace.
	proctest.WaitFor(t, 15*time.Second, "no evaluation process left in "+c.state, func() bool {
		return len(evalUserProcesses(t, c.state)) == 0
	})
}

// errorLine is the first line of msg that says "error" (Nix's message), else its last lines.
func errorLine(msg string) string {
	for line := range strings.SplitSeq(msg, "\n") {
		if strings.Contains(line, "error") {
			return strings.TrimSpace(line)
		}
	}
	return lastLines(msg, 3)
}

// evalUserProcesses are the processes of the evaluation user (harmonia-eval) whose working
// directory or command line is inside dir.
func evalUserProcesses(t *testing.T, dir string) []int {
	t.Helper()
	u, err := user.Lookup("harmonia-eval")
	if err != nil {
		t.Fatal(err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, pid := range storeProcesses(dir) {
		var st syscall.Stat_t
		if err := syscall.Stat("/proc/"+strconv.Itoa(pid), &st); err == nil && st.Uid == uint32(uid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// shPrelude opens a Nix let with this test's salt and sh: a /bin/sh derivation running a script.
func shPrelude(salt string) string {
	return `let
  salt = "` + salt + `";
  sh = name: script: builtins.derivation {
    inherit name salt;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" script ];
  };`
}
