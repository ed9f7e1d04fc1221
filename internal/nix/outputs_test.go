package nix

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// storeHashes is the hashDerivationModulo of .drv files read from the store at root, memoized:
// what the evaluator and the signer compute over a closure.
func storeHashes(t *testing.T, root string) func(string) (DrvHash, error) {
	memo := map[string]DrvHash{}
	var hash func(string) (DrvHash, error)
	hash = func(p string) (DrvHash, error) {
		if h, ok := memo[p]; ok {
			return h, nil
		}
		d, err := ReadDerivation(root, p)
		if err != nil {
			return DrvHash{}, err
		}
		h, err := d.Hash(p, hash)
		if err == nil {
			memo[p] = h
		}
		return h, err
	}
	return hash
}

// TestOutputPathsMatchNix: for every derivation Nix wrote, Unparse gives its .drv file byte for
// byte, and the output paths recomputed from the text and its inputs are the ones Nix chose.
func TestOutputPathsMatchNix(t *testing.T) {
	skipWithoutNixInstantiate(t)
	drvs := instantiateTestDrvs(t, "")
	hash := storeHashes(t, "")
	for _, attr := range testDrvAttrs("") {
		p := drvs[attr]
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		d, err := ParseDerivation(text)
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Unparse(); !bytes.Equal(got, text) {
			t.Errorf("%s: Unparse differs from the .drv file\n got %s\nwant %s", attr, got, text)
		}
		if err := d.CheckOutputs(p, hash); err != nil {
			t.Errorf("%s: %v", attr, err)
		}
	}
}

// TestForgedOutputsRefused: a .drv text whose output is another derivation's path (the
// poisoning of issue 24), or whose fixed output claims a path its hash does not give, fails
// the check with ErrWrongOutputs.
func TestForgedOutputsRefused(t *testing.T) {
	skipWithoutNixInstantiate(t)
	drvs := instantiateTestDrvs(t, "")
	hash := storeHashes(t, "")
	victim, err := ReadDerivation("", drvs["both"])
	if err != nil {
		t.Fatal(err)
	}
	forge := func(attr string, edit func(d *Derivation)) (string, *Derivation) {
		d, err := ReadDerivation("", drvs[attr])
		if err != nil {
			t.Fatal(err)
		}
		edit(d)
		text := d.Unparse()
		name := filepath.Base(drvs[attr])[HashPartLen+1:]
		return TextPath(name, sha256.Sum256(text), d.References()), d
	}
	for _, tt := range []struct {
		name string
		attr string
		edit func(d *Derivation)
	}{
		{"another derivation's output", "multi", func(d *Derivation) {
			o := d.Outputs["out"]
			o.Path = victim.Outputs["out"].Path
			d.Outputs["out"] = o
			d.Env["out"] = o.Path
			d.Args = []string{"-c", "echo attacker > $out"}
		}},
		{"its own output, another builder", "multi", func(d *Derivation) {
			d.Args = []string{"-c", "echo attacker > $out; echo > $dev"}
		}},
		{"a fixed output's path for another hash", "fixed", func(d *Derivation) {
			o := d.Outputs["out"]
			sum := sha256.Sum256([]byte("y"))
			o.Hash = hex.EncodeToString(sum[:])
			d.Outputs["out"] = o
		}},
		{"$out not its output", "both", func(d *Derivation) { d.Env["out"] = victim.Outputs["out"].Path + "x" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, d := forge(tt.attr, tt.edit)
			if err := d.CheckOutputs(p, hash); !errors.Is(err, ErrWrongOutputs) {
				t.Fatalf("CheckOutputs of a forged .drv: %v, want ErrWrongOutputs", err)
			}
		})
	}
}
