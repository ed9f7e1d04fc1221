package nix

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// A derivation's output paths follow from its text (Nix's derivations.cc: hashDerivationModulo,
// makeOutputPath): an input-addressed output's from the derivation with its own output paths
// blanked and each input derivation replaced by that input's hash, a fixed output's from its
// declared hash. Whoever holds the .drv closure can therefore check every output path a
// derivation claims, as Nix does before it builds one; a .drv that claims another's output path
// fails the check.

// DrvHash is what a derivation contributes to the hash of a derivation that uses it: Nix's
// hashDerivationModulo, which is the same for every output of an input-addressed derivation
// (and a fixed-output derivation has one output), and the names of its outputs.
type DrvHash struct {
	Sum     [sha256.Size]byte
	Outputs []string // sorted
}

// ErrWrongOutputs is wrapped by the error of a derivation whose declared output paths are not
// the ones its text gives.
var ErrWrongOutputs = errors.New("the derivation's output paths are not the ones its text gives")

// Unparse writes d as Nix writes a .drv file (Derivation::unparse): sorted, with Nix's escapes.
// A .drv file Nix wrote is exactly Unparse of its parse.
func (d *Derivation) Unparse() []byte { return d.unparse(false, nil) }

// unparse writes d; maskOutputs blanks the output paths and the environment variables named
// after outputs, and inputs (if not nil) replaces the input derivations by their hashes (hex →
// output names).
func (d *Derivation) unparse(maskOutputs bool, inputs map[string][]string) []byte {
	b := make([]byte, 0, 1024)
	raw := func(s string) []byte { return append(append(append(b, '"'), s...), '"') }
	b = append(b, "Derive(["...)
	for i, name := range d.OutputNames() {
		o := d.Outputs[name]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '(')
		b = raw(name)
		b = append(b, ',')
		if maskOutputs {
			b = raw("")
		} else {
			b = raw(o.Path)
		}
		b = append(b, ',')
		b = raw(o.HashAlgo)
		b = append(b, ',')
		b = raw(o.Hash)
		b = append(b, ')')
	}
	b = append(b, "],["...)
	if inputs == nil {
		inputs = d.InputDrvs
	}
	for i, in := range slices.Sorted(maps.Keys(inputs)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '(')
		b = raw(in)
		b = append(b, ",["...)
		for j, o := range slices.Compact(slices.Sorted(slices.Values(inputs[in]))) {
			if j > 0 {
				b = append(b, ',')
			}
			b = raw(o)
		}
		b = append(b, "])"...)
	}
	b = append(b, "],["...)
	for i, s := range slices.Compact(slices.Sorted(slices.Values(d.InputSrcs))) {
		if i > 0 {
			b = append(b, ',')
		}
		b = raw(s)
	}
	b = append(b, "],"...)
	b = raw(d.Platform)
	b = append(b, ',')
	b = appendEscaped(b, d.Builder)
	b = append(b, ",["...)
	for i, a := range d.Args {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendEscaped(b, a)
	}
	b = append(b, "],["...)
	for i, k := range slices.Sorted(maps.Keys(d.Env)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '(')
		b = appendEscaped(b, k)
		b = append(b, ',')
		v := d.Env[k]
		if _, isOutput := d.Outputs[k]; maskOutputs && isOutput {
			v = ""
		}
		b = appendEscaped(b, v)
		b = append(b, ')')
	}
	return append(b, "])"...)
}

// appendEscaped appends s quoted with Nix's escapes (printString).
func appendEscaped(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// DrvName is the name of the derivation at drvPath, as Nix takes it for output paths: the
// path's name without ".drv".
func DrvName(drvPath string) (string, error) {
	sp, err := ParseStorePath(drvPath)
	if err != nil {
		return "", err
	}
	name, ok := strings.CutSuffix(sp.Name, ".drv")
	if !ok || name == "" {
		return "", fmt.Errorf("%s is not a .drv path", drvPath)
	}
	return name, nil
}

// fixed reports whether d is a fixed-output derivation: one output, "out", with a hash.
func (d *Derivation) fixed() bool {
	o, ok := d.Outputs["out"]
	return len(d.Outputs) == 1 && ok && o.Hash != ""
}

// Hash is hashDerivationModulo of d (at drvPath) for a derivation that takes it as input.
// inputHash gives the same for each of d's input derivations.
func (d *Derivation) Hash(drvPath string, inputHash func(drvPath string) (DrvHash, error)) (DrvHash, error) {
	name, err := DrvName(drvPath)
	if err != nil {
		return DrvHash{}, err
	}
	h := DrvHash{Outputs: d.OutputNames()}
	if d.fixed() {
		o := d.Outputs["out"]
		path, err := d.fixedOutputPath(name)
		if err != nil {
			return DrvHash{}, err
		}
		h.Sum = sha256.Sum256([]byte("fixed:out:" + o.HashAlgo + ":" + o.Hash + ":" + path))
		return h, nil
	}
	h.Sum, err = d.hashModulo(drvPath, false, inputHash)
	if err != nil {
		return DrvHash{}, err
	}
	return h, nil
}

// hashModulo hashes d's text with its input derivations replaced by their hashes, and its own
// output paths blanked if mask.
func (d *Derivation) hashModulo(drvPath string, mask bool, inputHash func(string) (DrvHash, error)) ([sha256.Size]byte, error) {
	inputs := map[string][]string{}
	for in, outs := range d.InputDrvs {
		h, err := inputHash(in)
		if err != nil {
			return [sha256.Size]byte{}, fmt.Errorf("input %s of %s: %w", in, drvPath, err)
		}
		k := hex.EncodeToString(h.Sum[:])
		for _, o := range outs {
			if !slices.Contains(h.Outputs, o) {
				return [sha256.Size]byte{}, fmt.Errorf("%s takes output %q of %s, which has none", drvPath, o, in)
			}
			inputs[k] = append(inputs[k], o)
		}
	}
	return sha256.Sum256(d.unparse(mask, inputs)), nil
}

// fixedOutputPath is the path of the output of a fixed-output derivation named name: from its
// declared hash, whatever the text says (makeFixedOutputPath).
func (d *Derivation) fixedOutputPath(name string) (string, error) {
	o := d.Outputs["out"]
	algo, recursive := strings.CutPrefix(o.HashAlgo, "r:")
	sum, err := hex.DecodeString(o.Hash)
	if err != nil {
		return "", fmt.Errorf("fixed output of %s: hash %q is not base16", name, o.Hash)
	}
	size := map[string]int{"md5": 16, "sha1": 20, "sha256": 32, "sha512": 64}[algo]
	if size == 0 || len(sum) != size {
		return "", fmt.Errorf("fixed output of %s: unsupported hash %s:%s", name, o.HashAlgo, o.Hash)
	}
	if recursive && algo == "sha256" {
		return SourcePath(name, [sha256.Size]byte(sum), nil, false), nil
	}
	method := ""
	if recursive {
		method = "r:"
	}
	inner := sha256.Sum256([]byte("fixed:out:" + method + algo + ":" + o.Hash + ":"))
	return makeStorePath("output:out", inner, name), nil
}

// OutputPaths are the output paths Nix gives the derivation d named name (output → path),
// computed from its text and its inputs' hashes (inputHash) alone: what d's text says of its
// own output paths does not count. Floating content-addressed and deferred outputs have no path
// in advance and are not supported.
func (d *Derivation) OutputPaths(name string, inputHash func(string) (DrvHash, error)) (map[string]string, error) {
	for o, out := range d.Outputs {
		if out.Path == "" && out.HashAlgo != "" && out.Hash == "" {
			return nil, fmt.Errorf("output %q of %s is content-addressed, which is not supported", o, name)
		}
	}
	if d.fixed() {
		p, err := d.fixedOutputPath(name)
		if err != nil {
			return nil, err
		}
		return map[string]string{"out": p}, nil
	}
	sum, err := d.hashModulo(name, true, inputHash)
	if err != nil {
		return nil, err
	}
	paths := make(map[string]string, len(d.Outputs))
	for o := range d.Outputs {
		p := name
		if o != "out" {
			p += "-" + o
		}
		paths[o] = makeStorePath("output:"+o, sum, p)
	}
	return paths, nil
}

// CheckOutputs fails, wrapping ErrWrongOutputs, unless every output path d declares (and the
// environment variable of each output) is the one Nix would give it: the check Nix makes before
// it builds a derivation from its store.
func (d *Derivation) CheckOutputs(drvPath string, inputHash func(string) (DrvHash, error)) error {
	name, err := DrvName(drvPath)
	if err != nil {
		return err
	}
	want, err := d.OutputPaths(name, inputHash)
	if err != nil {
		return fmt.Errorf("%s: %w", drvPath, err)
	}
	for _, o := range d.OutputNames() {
		if got := d.Outputs[o].Path; got != want[o] {
			return fmt.Errorf("%w: %s declares output %q at %s, its text gives %s", ErrWrongOutputs, drvPath, o, got, want[o])
		}
		if v, ok := d.Env[o]; ok && v != want[o] {
			return fmt.Errorf("%w: %s sets $%s to %s, not its output path %s", ErrWrongOutputs, drvPath, o, v, want[o])
		}
	}
	return nil
}
