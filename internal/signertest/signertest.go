// Package signertest runs the signer and cache roles in a test's process: a local blob store,
// both roles on one httptest server, and a nodes row through which signer clients find it, as
// they find a real signer node.
package signertest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signer"
)

// Token is the cluster token of every Cluster.
const Token = "signertest-cluster-token"

// Cluster is a signer and cache serving one local blob store.
type Cluster struct {
	URL    string // the signer's and cache's base URL
	Key    nix.SecretKey
	Store  *blob.Local
	Client *signer.Client // discovers the signer through the nodes table
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
	logger := queuetest.TestLogger(t)
	mux := http.NewServeMux()
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	uploadBase := ts.URL
	var store *blob.Local
	var uploads http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		store.UploadHandler().ServeHTTP(w, r)
	})
	if o.Uploads != nil {
		us := httptest.NewServer(o.Uploads(uploads))
		t.Cleanup(us.Close)
		uploadBase = us.URL
	} else {
		mux.Handle("PUT /api/blob/{key...}", uploads)
	}
	if store, err = blob.NewLocal(t.TempDir(), uploadBase, []byte("0123456789abcdef0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv, err := signer.New(signer.Config{Store: store, Key: key, ClusterToken: Token, Logger: logger}, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.RecordKey(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Register(mux)
	cache.New(cache.Config{Store: store, Logger: logger}).Register(mux)

	queuetest.InsertNode(t, pool, queuetest.Node{ID: "signer-1", Roles: []string{"signer", "cache"}})
	queuetest.Exec(t, pool, `UPDATE nodes SET endpoint = $1 WHERE id = 'signer-1'`, ts.URL)
	client := signer.NewClient(signer.ClientConfig{Token: Token, GiveUpAfter: 20 * time.Second,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second}, pool, logger)
	return &Cluster{URL: ts.URL, Key: key, Store: store, Client: client}
}
