// Package signertest runs the signer and cache roles in a test's process: a local blob store,
// both roles on one httptest server, and a nodes row through which signer clients find it, as
// they find a real signer node.
package signertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signer"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
)

// Secret is the cluster secret of every Cluster.
const Secret = "signertest-cluster-secret"

// Cluster is a signer and cache serving one local blob store.
type Cluster struct {
	URL    string // the signer's and cache's base URL
	Key    nix.SecretKey
	Store  *blob.Local
	Tokens *nodetoken.Key // issues node tokens under Secret

	pool   *pgxpool.Pool
	logger *slog.Logger
}

// PublicKey is the key Nix clients trust, "name:base64".
func (c *Cluster) PublicKey() string { return c.Key.Public().String() }

// Options adjust a Cluster.
type Options struct {
	// Uploads wraps the handler of presigned uploads, served apart from the signer (tests count
	// or fail PUTs with it). nil serves them on the signer's server.
	Uploads func(http.Handler) http.Handler
	// KeyName names the signing key; default "signertest-1".
	KeyName string
}

// Start runs a Cluster for the rest of t, registered as node "signer-1" in pool's database.
func Start(t testing.TB, pool *pgxpool.Pool, o Options) *Cluster {
	t.Helper()
	if o.KeyName == "" {
		o.KeyName = "signertest-1"
	}
	key, err := nix.GenerateKey(o.KeyName)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := nodetoken.NewKey(Secret)
	if err != nil {
		t.Fatal(err)
	}
	logger := queuetest.TestLogger(t)
	mux := http.NewServeMux()
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	uploadBase := ts.URL
	var store *blob.Local
	var uploads http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		store.UploadHandler(logger).ServeHTTP(w, r)
	})
	if o.Uploads != nil {
		us := httptest.NewServer(o.Uploads(uploads))
		t.Cleanup(us.Close)
		uploadBase = us.URL
	} else {
		mux.Handle("PUT /api/blob/{key...}", uploads)
	}
	if store, err = blob.NewLocal(t.TempDir(), uploadBase, nodetoken.Derive(Secret, "blob upload")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv, err := signer.New(signer.Config{Store: store, Key: key, Tokens: tokens, Logger: logger}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.RecordKey(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Register(access.NewRoutes(mux, nil))
	cache.New(cache.Config{Store: store, Derivations: blob.NewDerivations(pool), Logger: logger}).Register(access.NewRoutes(mux, nil))

	queuetest.InsertNode(t, pool, queuetest.Node{ID: "signer-1", Roles: []string{"signer", "cache"}})
	queuetest.Exec(t, pool, `UPDATE nodes SET endpoint = $1 WHERE id = 'signer-1'`, ts.URL)
	return &Cluster{URL: ts.URL, Key: key, Store: store, Tokens: tokens, pool: pool, logger: logger}
}

// Token returns node id's token in roles (default: builder and evaluator).
func (c *Cluster) Token(t testing.TB, id string, roles ...string) string {
	t.Helper()
	if len(roles) == 0 {
		roles = []string{config.RoleBuilder, config.RoleEvaluator}
	}
	tok, err := c.Tokens.Issue(nodetoken.Identity{NodeID: id, Roles: roles})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Client returns a signer client that authenticates as node id in roles (default: builder and
// evaluator), with short backoffs.
func (c *Cluster) Client(t testing.TB, id string, roles ...string) *signerclient.Client {
	t.Helper()
	return signerclient.New(signerclient.Config{Token: c.Token(t, id, roles...), GiveUpAfter: 20 * time.Second,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second}, c.pool, c.logger)
}

// SeedPath is a store path to put in the cache directly.
type SeedPath struct {
	StorePath  string
	References []string // full store paths
	Deriver    string   // full store path or ""
}

// Seed puts paths of the store at storeRoot ("" for the system store) into the cache directly,
// NAR and signed narinfo, bypassing the signer's API: what an evaluator and earlier builds
// published before the test's own steps.
func (c *Cluster) Seed(t testing.TB, storeRoot string, paths ...SeedPath) {
	t.Helper()
	ctx := context.Background()
	var drvs []string
	for _, p := range paths {
		if strings.HasSuffix(p.StorePath, ".drv") {
			drvs = append(drvs, p.StorePath)
			continue
		}
		var nar bytes.Buffer
		sz, err := nix.CompressNAR(ctx, filepath.Join(storeRoot, p.StorePath), &nar)
		if err != nil {
			t.Fatal(err)
		}
		refs := make([]string, len(p.References))
		for i, r := range p.References {
			refs[i] = strings.TrimPrefix(r, nix.StoreDir+"/")
		}
		ni := nix.NewNarInfo(p.StorePath, sz, refs)
		ni.Deriver = strings.TrimPrefix(p.Deriver, nix.StoreDir+"/")
		put := func(key string, data []byte) {
			sum := sha256.Sum256(data)
			err := c.Store.Put(ctx, key, bytes.NewReader(data), int64(len(data)),
				blob.PutOptions{SHA256: sum[:], IfAbsent: true})
			if err != nil && !errors.Is(err, blob.ErrExists) {
				t.Fatalf("seed %s: %v", key, err)
			}
		}
		put(ni.URL, nar.Bytes())
		if err := ni.Sign(c.Key); err != nil {
			t.Fatal(err)
		}
		text, err := ni.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		sp, _ := nix.ParseStorePath(p.StorePath)
		put(sp.Hash+".narinfo", text)
	}
	c.seedDerivations(t, storeRoot, drvs)
}

// seedDerivations stores .drv files of the store at storeRoot as the signer publishes them
// (blobtest.PutDerivations).
func (c *Cluster) seedDerivations(t testing.TB, storeRoot string, paths []string) {
	t.Helper()
	texts := make(map[string][]byte, len(paths))
	for _, p := range paths {
		text, err := os.ReadFile(filepath.Join(storeRoot, p))
		if err != nil {
			t.Fatal(err)
		}
		texts[p] = text
	}
	blobtest.PutDerivations(t, c.pool, c.Key, texts)
}

// Enqueue stores the .drv files of ds in the cache and enqueues them (blobtest.EnqueueStored),
// as an evaluation publishes its .drv closure before it enqueues; it returns the new jobs.
func (c *Cluster) Enqueue(t testing.TB, project *int64, ds ...queuetest.NixDrv) int {
	t.Helper()
	return blobtest.EnqueueStored(t, c.pool, c.Key, project, ds...)
}
