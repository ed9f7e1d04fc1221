package blobtest

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

// PublishPath puts store path path into store as the signer does: a zstd NAR from CompressNAR
// under nar/<filehash>.nar.zst and a narinfo with its references (as the local store knows
// them), signed with key. CA is left out so that the signature is what Nix checks.
func PublishPath(t testing.TB, store blob.Store, key nix.SecretKey, path string) {
	t.Helper()
	ctx := context.Background()
	sp, err := nix.ParseStorePath(path)
	if err != nil {
		t.Fatal(err)
	}
	var nar bytes.Buffer
	sizes, err := nix.CompressNAR(ctx, path, &nar)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, b []byte) {
		if err := store.Put(ctx, key, bytes.NewReader(b), int64(len(b)), blob.PutOptions{}); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}
	put(nix.NarURL(sizes.FileHash), nar.Bytes())
	out, stderr, err := nixtest.Offline(t, "nix-store", "-q", "--references", path)
	if err != nil {
		t.Fatalf("nix-store -q --references %s: %v\n%s", path, err, stderr)
	}
	var refs []string
	for _, r := range strings.Fields(out) {
		rsp, err := nix.ParseStorePath(r)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, rsp.Base())
	}
	ni := nix.NewNarInfo(path, sizes, refs)
	if err := ni.Sign(key); err != nil {
		t.Fatal(err)
	}
	text, err := ni.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	put(sp.Hash+".narinfo", text)
}
