package blobtest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// PutDerivations stores .drv files (store path → text) as the signer publishes them
// (blob.Derivations): a narinfo signed with key, the text and the derivation's hash, computed
// over what is stored with them and what is stored already. Output paths are not checked: a
// test may store a forged .drv, as a compromised or older signer could have.
func PutDerivations(t testing.TB, pool *pgxpool.Pool, key nix.SecretKey, texts map[string][]byte) {
	t.Helper()
	if len(texts) == 0 {
		return
	}
	ctx := context.Background()
	drvs := blob.NewDerivations(pool)
	parsed := map[string]*nix.Derivation{}
	var inputs []string
	for p, text := range texts {
		d, err := nix.ParseDerivation(text)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		parsed[p] = d
		for in := range d.InputDrvs {
			if texts[in] == nil {
				inputs = append(inputs, in)
			}
		}
	}
	known, err := drvs.Hashes(ctx, inputs)
	if err != nil {
		t.Fatal(err)
	}
	var hash func(string) (nix.DrvHash, error)
	hash = func(p string) (nix.DrvHash, error) {
		if h, ok := known[p]; ok {
			return h, nil
		}
		d, ok := parsed[p]
		if !ok {
			return nix.DrvHash{}, fmt.Errorf("%s is neither stored nor given", p)
		}
		h, err := d.Hash(p, hash)
		known[p] = h
		return h, err
	}
	objs := make([]blob.Derivation, 0, len(texts))
	for _, p := range slices.Sorted(maps.Keys(texts)) {
		h, err := hash(p)
		if err != nil {
			t.Fatal(err)
		}
		text := texts[p]
		nar := nix.FileNAR(text, false)
		narSum := sha256.Sum256(nar)
		ni := nix.NewNarInfo(p, nix.Sizes{NarHash: nix.FormatSHA256(narSum), NarSize: int64(len(nar)),
			FileHash: nix.FormatSHA256(narSum), FileSize: int64(len(nar))}, nil)
		ni.URL, ni.Compression = blob.DrvNARKey(narSum), "none"
		for _, r := range parsed[p].References() {
			ni.References = append(ni.References, strings.TrimPrefix(r, nix.StoreDir+"/"))
		}
		ni.CA = "text:" + nix.FormatSHA256(sha256.Sum256(text))
		if err := ni.Sign(key); err != nil {
			t.Fatal(err)
		}
		info, err := ni.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, blob.Derivation{StorePath: p, NarInfo: info, Text: text, NarHash: narSum,
			NarSize: int64(len(nar)), Hash: h.Sum})
	}
	if _, err := drvs.Put(ctx, objs); err != nil {
		t.Fatal(err)
	}
}

// EnqueueStored stores the .drv files of ds (PutDerivations, signed with key) and enqueues
// them, as an evaluation publishes its .drv closure before it enqueues; it returns the number
// of new jobs.
func EnqueueStored(t testing.TB, pool *pgxpool.Pool, key nix.SecretKey, project *int64, ds ...queuetest.NixDrv) int {
	t.Helper()
	texts := make(map[string][]byte, len(ds))
	qs := make([]queue.Derivation, len(ds))
	for i, d := range ds {
		texts[d.DrvPath], qs[i] = d.Text, d.Derivation
	}
	PutDerivations(t, pool, key, texts)
	return queuetest.Enqueue(t, pool, project, qs...)
}
