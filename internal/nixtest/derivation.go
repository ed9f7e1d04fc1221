package nixtest

import (
	"crypto/sha256"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// Derivation is what `nix derivation show` says of a .drv.
type Derivation struct {
	System    string
	Builder   string
	Args      []string
	Env       map[string]string
	InputSrcs []string
	// Outputs maps each output's name to its path ("" for a floating content-addressed one).
	Outputs map[string]string
	// InputDrvs maps each input derivation to the outputs taken from it.
	InputDrvs map[string][]string
}

// ShowDerivations runs `nix derivation show` (`nix show-derivation` before Nix 2.15) on drvs,
// with args before them (e.g. --store DIR), and returns what it says by .drv path. Both JSON
// forms of an input's outputs are read: a list, or since 2.18 {"outputs": [...]}.
func ShowDerivations(t testing.TB, args []string, drvs ...string) map[string]Derivation {
	t.Helper()
	cmd := []string{"--extra-experimental-features", "nix-command", "derivation", "show"}
	if versionBefore(Version(t), 2, 15) {
		cmd = []string{"--extra-experimental-features", "nix-command", "show-derivation"}
	}
	cmd = append(append(cmd, args...), drvs...)
	out, err := exec.Command("nix", cmd...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("nix %s: %v\n%s", strings.Join(cmd, " "), err, msg)
	}
	var shown map[string]struct {
		System    string                           `json:"system"`
		Builder   string                           `json:"builder"`
		Args      []string                         `json:"args"`
		Env       map[string]string                `json:"env"`
		InputSrcs []string                         `json:"inputSrcs"`
		Outputs   map[string]struct{ Path string } `json:"outputs"`
		InputDrvs map[string]json.RawMessage       `json:"inputDrvs"`
	}
	if err := json.Unmarshal(out, &shown); err != nil {
		t.Fatalf("nix derivation show: %v\n%s", err, out)
	}
	res := make(map[string]Derivation, len(shown))
	for drv, s := range shown {
		d := Derivation{System: s.System, Builder: s.Builder, Args: s.Args, Env: s.Env, InputSrcs: s.InputSrcs,
			Outputs: map[string]string{}, InputDrvs: map[string][]string{}}
		for name, o := range s.Outputs {
			d.Outputs[name] = o.Path
		}
		for in, raw := range s.InputDrvs {
			var outs []string
			if err := json.Unmarshal(raw, &outs); err != nil {
				var o struct {
					Outputs []string `json:"outputs"`
				}
				if err := json.Unmarshal(raw, &o); err != nil {
					t.Fatalf("nix derivation show: input %s of %s: %s", in, drv, raw)
				}
				outs = o.Outputs
			}
			d.InputDrvs[in] = outs
		}
		res[drv] = d
	}
	return res
}

// versionBefore reports whether Nix version v ("2.8.0") is older than major.minor.
func versionBefore(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	ma, _ := strconv.Atoi(parts[0])
	mi := 0
	if len(parts) > 1 {
		mi, _ = strconv.Atoi(parts[1])
	}
	return ma < major || ma == major && mi < minor
}

// ForgedDerivation is the .drv of the poisoning attack (issue 24): a text in Nix's form that
// claims victim's "out" path with a builder of the attacker's, and the store path the text has
// (a text path with no references, as builtins.toFile writes it). Nix would refuse to register
// it: its output path is not the one its text gives.
func ForgedDerivation(victim *nix.Derivation) (path string, text []byte) {
	out := victim.Outputs["out"].Path
	forged := &nix.Derivation{
		Outputs:   map[string]nix.DerivationOutput{"out": {Path: out}},
		InputDrvs: map[string][]string{}, InputSrcs: []string{}, Platform: victim.Platform, Builder: "/bin/sh",
		Args: []string{"-c", "echo attacker > $out"},
		Env:  map[string]string{"builder": "/bin/sh", "name": "forged", "out": out, "system": victim.Platform},
	}
	text = forged.Unparse()
	return nix.TextPath("forged.drv", sha256.Sum256(text), nil), text
}
