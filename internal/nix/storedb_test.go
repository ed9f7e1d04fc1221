package nix

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// nixPathInfos returns what `nix path-info --json` says about paths, in PathInfo form;
// derivations selects the .drv files themselves rather than their outputs.
func nixPathInfos(t *testing.T, root string, paths []string, derivations bool) map[string]PathInfo {
	t.Helper()
	args := append(testStoreArgs(root), "path-info", "--json")
	if derivations {
		args = append(args, "--derivation")
	}
	type info struct {
		Path       string   `json:"path"`
		Valid      *bool    `json:"valid"`
		NarHash    string   `json:"narHash"`
		NarSize    int64    `json:"narSize"`
		References []string `json:"references"`
		Deriver    string   `json:"deriver"`
	}
	// A list up to Nix 2.18, an object keyed by path since 2.19 (as nixtest.ParsePathInfos
	// reads it for other packages).
	out := []byte(runNix(t, "nix", append(args, paths...)...))
	var infos []info
	if err := json.Unmarshal(out, &infos); err != nil {
		var byPath map[string]*info
		if err := json.Unmarshal(out, &byPath); err != nil {
			t.Fatal(err)
		}
		for p, i := range byPath {
			if i == nil {
				t.Fatalf("nix path-info: %s is not valid", p)
			}
			i.Path = p
			infos = append(infos, *i)
		}
	}
	res := map[string]PathInfo{}
	for _, i := range infos {
		if i.Valid != nil && !*i.Valid {
			t.Fatalf("nix path-info: %s is not valid", i.Path)
		}
		res[i.Path] = PathInfo{
			Path:       i.Path,
			NarHash:    nixNarHash(t, i.NarHash),
			NarSize:    i.NarSize,
			References: i.References,
			Deriver:    i.Deriver,
		}
	}
	return res
}

// nixNarHash converts path-info's hash (SRI in Nix 2.8, sha256:<nix32> in older versions).
func nixNarHash(t *testing.T, h string) string {
	t.Helper()
	if sri, ok := strings.CutPrefix(h, "sha256-"); ok {
		b, err := base64.StdEncoding.DecodeString(sri)
		if err != nil || len(b) != sha256.Size {
			t.Fatalf("nix path-info narHash %q: %v", h, err)
		}
		return FormatSHA256([sha256.Size]byte(b))
	}
	if _, err := ParseSHA256(h); err != nil {
		t.Fatal(err)
	}
	return h
}

// randomStorePath returns a well-formed path that no store holds.
func randomStorePath(t *testing.T, name string) string {
	var h [20]byte
	rand.Read(h[:])
	return StoreDir + "/" + EncodeBase32(h[:]) + "-" + name
}

func openStoreDB(t *testing.T, root string) *StoreDB {
	t.Helper()
	db, err := OpenStoreDB(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db
}

func TestStoreDBMatchesNix(t *testing.T) {
	skipWithoutNixInstantiate(t)
	drvs := instantiateTestDrvs(t, "")
	drvPaths := slices.Sorted(maps.Values(drvs))
	consumer, err := ReadDerivation("", drvs["consumer"])
	if err != nil {
		t.Fatal(err)
	}
	srcs := consumer.InputSrcs
	// Build one derivation so that a path with a deriver and a reference to another output
	// is covered too. No sandbox: it would lack /bin/sh.
	built := strings.Fields(runNix(t, "nix-store", "--option", "sandbox", "false", "-r", drvs["both"]))

	want := nixPathInfos(t, "", drvPaths, true)
	maps.Copy(want, nixPathInfos(t, "", append(slices.Clone(srcs), built...), false))
	if len(built) != 1 || want[built[0]].Deriver != drvs["both"] || len(want[built[0]].References) != 1 {
		t.Fatalf("built %q: path-info %+v, want a deriver and one reference", built, want[built[0]])
	}

	missing := randomStorePath(t, "harmonia-test-missing")
	query := append(slices.Sorted(maps.Keys(want)), missing)
	db := openStoreDB(t, "")
	got, err := db.PathInfos(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PathInfos =\n%+v\nnix path-info says\n%+v", got, want)
	}
	if _, ok := got[missing]; ok {
		t.Errorf("missing path %s reported valid", missing)
	}

	// Thousands of paths, with duplicates, span several chunks and still find the same ones.
	var many []string
	for i := range 3 * storeDBChunk {
		many = append(many, randomStorePath(t, "harmonia-test-missing"))
		if i%100 == 0 {
			many = append(many, query...)
		}
	}
	got, err = db.PathInfos(context.Background(), many)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PathInfos of %d paths differs from nix path-info: %+v", len(many), got)
	}

	if got, err := db.PathInfos(context.Background(), nil); err != nil || len(got) != 0 {
		t.Errorf("PathInfos(nil) = %v, %v; want empty", got, err)
	}
	if _, err := db.PathInfos(context.Background(), []string{"/tmp/x"}); err == nil {
		t.Error("PathInfos accepted a path outside the store")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := db.PathInfos(ctx, query); err == nil {
		t.Error("PathInfos succeeded with a cancelled context")
	}
}

func TestStoreDBChrootStore(t *testing.T) {
	skipWithoutNixInstantiate(t)
	root := writableTempDir(t)
	drvs := instantiateTestDrvs(t, root)
	drvPaths := slices.Sorted(maps.Values(drvs))
	want := nixPathInfos(t, root, drvPaths, true)

	db := openStoreDB(t, root)
	got, err := db.PathInfos(context.Background(), drvPaths)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PathInfos =\n%+v\nnix path-info --store %s says\n%+v", got, root, want)
	}
	// The input source was copied into the chroot store along with the derivations.
	consumer, err := ReadDerivation(root, drvs["consumer"])
	if err != nil {
		t.Fatal(err)
	}
	src := consumer.InputSrcs[0]
	if got, err := db.PathInfos(context.Background(), []string{src}); err != nil || got[src].NarSize == 0 {
		t.Errorf("PathInfos(%s) = %+v, %v; want it valid", src, got, err)
	}
	if !slices.Contains(got[drvs["consumer"]].References, src) {
		t.Errorf("consumer references %q, want %s among them", got[drvs["consumer"]].References, src)
	}
}

func TestOpenStoreDBMissing(t *testing.T) {
	root := t.TempDir()
	if _, err := OpenStoreDB(root); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("OpenStoreDB of an empty directory: %v, want a not-exist error", err)
	}
	// Opening read-only must never create the database.
	if _, err := os.Stat(filepath.Join(root, storeDBPath)); !os.IsNotExist(err) {
		t.Errorf("OpenStoreDB created %s: %v", storeDBPath, err)
	}
}

func TestDBNarHash(t *testing.T) {
	const (
		hex   = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
		nix32 = "10a83a91g1r50bdw8g4hn47m7j7m6angpabwc80l9c16nx11cw9d"
	)
	for _, in := range []string{"sha256:" + hex, "sha256:" + strings.ToUpper(hex), "sha256:" + nix32} {
		if got, err := dbNarHash(in); err != nil || got != "sha256:"+nix32 {
			t.Errorf("dbNarHash(%q) = %q, %v; want sha256:%s", in, got, err, nix32)
		}
	}
	for _, in := range []string{"", hex, "md5:" + hex, "sha256:" + hex[:62], "sha256:" + hex[:63] + "g", "sha256:" + nix32[:51] + "e"} {
		if got, err := dbNarHash(in); err == nil {
			t.Errorf("dbNarHash(%q) = %q, want an error", in, got)
		}
	}
}
