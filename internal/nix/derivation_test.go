package nix

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// testDrvsNix covers what ParseDerivation must get right: several outputs, edges that select
// particular outputs, every escape, a source file input, a fixed output, a floating CA output
// (empty path), and __structuredAttrs (attributes inside "__json").
const testDrvsNix = `
let
  sh = args: builtins.derivation ({ builder = "/bin/sh"; system = builtins.currentSystem; } // args);
  multi = sh {
    name = "harmonia-test-multi";
    outputs = [ "out" "dev" ];
    args = [ "-c" "echo out > $out; echo dev > $dev" ];
    tricky = "quote\" backslash\\ newline\n tab\t cr\r dollar\${x} end";
    empty = "";
  };
  fixed = sh {
    name = "harmonia-test-fixed";
    args = [ "-c" "printf x > $out" ];
    outputHashMode = "flat";
    outputHashAlgo = "sha256";
    outputHash = builtins.hashString "sha256" "x";
  };
  consumer = sh {
    name = "harmonia-test-consumer";
    args = [ "-c" "printf '%s %s' ${multi.dev} ${fixed} > $out" ./script.sh ];
    requiredSystemFeatures = [ "kvm" "big-parallel" ];
  };
  both = sh {
    name = "harmonia-test-both";
    args = [ "-c" "printf %s ${multi.dev} > $out" ];
    deps = [ multi.out multi.dev ];
  };
  structured = sh {
    name = "harmonia-test-structured";
    __structuredAttrs = true;
    requiredSystemFeatures = [ "kvm" ];
    args = [ "-c" "x" ];
  };
  floating = sh {
    name = "harmonia-test-floating";
    __contentAddressed = true;
    outputHashMode = "recursive";
    outputHashAlgo = "sha256";
    args = [ "-c" "x" ];
  };
in { inherit multi fixed consumer both structured floating; }
`

// testDrvAttrs lists the attributes of testDrvsNix for the store rooted at root. The floating
// CA derivation needs the ca-derivations feature, which also makes Nix add its CA tables to the
// store's database, so it is only instantiated in throwaway chroot stores.
func testDrvAttrs(root string) []string {
	attrs := []string{"multi", "fixed", "consumer", "both", "structured"}
	if root != "" {
		attrs = append(attrs, "floating")
	}
	return attrs
}

// testStoreArgs selects the store rooted at root ("" for the system store) in Nix commands.
func testStoreArgs(root string) []string {
	if root == "" {
		return nil
	}
	return []string{"--store", root, "--extra-experimental-features", "ca-derivations"}
}

// skipWithoutNixInstantiate skips the tests that need Nix to generate derivations.
func skipWithoutNixInstantiate(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nix-instantiate"); err != nil {
		t.Skip("nix-instantiate not on PATH")
	}
}

// instantiateTestDrvs writes testDrvsNix and instantiates it in the store rooted at root ("" for
// the system store), returning attribute name → .drv path.
func instantiateTestDrvs(t *testing.T, root string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "script.sh"), []byte("echo harmonia-test\n"), 0o644)
	writeFile(t, filepath.Join(dir, "drvs.nix"), []byte(testDrvsNix), 0o644)
	args := append(testStoreArgs(root), filepath.Join(dir, "drvs.nix"))
	attrs := testDrvAttrs(root)
	for _, a := range attrs {
		args = append(args, "-A", a)
	}
	out := strings.Fields(runNix(t, "nix-instantiate", args...))
	if len(out) != len(attrs) {
		t.Fatalf("nix-instantiate printed %q, want %d paths", out, len(attrs))
	}
	drvs := map[string]string{}
	for i, a := range attrs {
		drvs[a] = out[i]
	}
	return drvs
}

// shownInputs is an input derivation's outputs in `nix show-derivation`: a list up to Nix 2.17,
// an object {"outputs": [...], "dynamicOutputs": {}} since.
type shownInputs []string

func (s *shownInputs) UnmarshalJSON(b []byte) error {
	var o struct {
		Outputs []string `json:"outputs"`
	}
	if err := json.Unmarshal(b, (*[]string)(s)); err == nil {
		return nil
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	*s = o.Outputs
	return nil
}

// showDerivation returns what `nix show-derivation` (`nix derivation show` since 2.15) says
// about drv, in Derivation form.
func showDerivation(t *testing.T, root, drv string) *Derivation {
	t.Helper()
	args := append(testStoreArgs(root), "show-derivation", drv)
	var shown map[string]struct {
		Outputs map[string]struct {
			Path     string `json:"path"`
			HashAlgo string `json:"hashAlgo"`
			Method   string `json:"method"` // since 2.18; hashAlgo no longer says "r:"
			Hash     string `json:"hash"`
		} `json:"outputs"`
		InputSrcs []string               `json:"inputSrcs"`
		InputDrvs map[string]shownInputs `json:"inputDrvs"`
		System    string                 `json:"system"`
		Builder   string                 `json:"builder"`
		Args      []string               `json:"args"`
		Env       map[string]string      `json:"env"`
	}
	if err := json.Unmarshal([]byte(runNix(t, "nix", args...)), &shown); err != nil {
		t.Fatal(err)
	}
	s, ok := shown[drv]
	if !ok || len(shown) != 1 {
		t.Fatalf("nix show-derivation %s: got %d entries, none for the path", drv, len(shown))
	}
	d := &Derivation{
		Outputs:   map[string]DerivationOutput{},
		InputDrvs: map[string][]string{},
		InputSrcs: s.InputSrcs,
		Platform:  s.System,
		Builder:   s.Builder,
		Args:      s.Args,
		Env:       s.Env,
	}
	for drv, outs := range s.InputDrvs {
		d.InputDrvs[drv] = outs
	}
	for name, o := range s.Outputs {
		algo := o.HashAlgo
		switch o.Method {
		case "nar":
			algo = "r:" + algo
		case "text":
			algo = "text:" + algo
		}
		d.Outputs[name] = DerivationOutput{Path: o.Path, HashAlgo: algo, Hash: o.Hash}
	}
	return d
}

func TestParseDerivationMatchesNix(t *testing.T) {
	skipWithoutNixInstantiate(t)
	drvs := instantiateTestDrvs(t, "")
	parsed := map[string]*Derivation{}
	for _, attr := range testDrvAttrs("") {
		drv := drvs[attr]
		d, err := ReadDerivation("", drv)
		if err != nil {
			t.Fatalf("%s: %v", attr, err)
		}
		parsed[attr] = d
		want := showDerivation(t, "", drv)
		if !reflect.DeepEqual(d, want) {
			t.Errorf("%s: ParseDerivation(%s) =\n%+v\nnix show-derivation says\n%+v", attr, drv, d, want)
		}
		// The .drv's references are exactly what Nix registered for it.
		wantRefs := strings.Fields(runNix(t, "nix-store", "-q", "--references", drv))
		slices.Sort(wantRefs)
		if got := d.References(); !slices.Equal(got, wantRefs) {
			t.Errorf("%s: References() = %q, nix-store -q --references says %q", attr, got, wantRefs)
		}
		if got, want := d.Name(), strings.TrimSuffix(drv[len(StoreDir)+1+HashPartLen+1:], ".drv"); got != want {
			t.Errorf("%s: Name() = %q, want %q", attr, got, want)
		}
	}

	// Spot checks that do not depend on the JSON comparison being right.
	multi, consumer := parsed["multi"], parsed["consumer"]
	if got, want := multi.Env["tricky"], "quote\" backslash\\ newline\n tab\t cr\r dollar${x} end"; got != want {
		t.Errorf("escaped env value = %q, want %q", got, want)
	}
	if v, ok := multi.Env["empty"]; !ok || v != "" {
		t.Errorf(`env "empty" = %q, %v; want "", true`, v, ok)
	}
	if got := multi.OutputNames(); !slices.Equal(got, []string{"dev", "out"}) {
		t.Errorf("OutputNames() = %q, want [dev out]", got)
	}
	if got := consumer.InputDrvs[drvs["multi"]]; !slices.Equal(got, []string{"dev"}) {
		t.Errorf("consumer selects %q of multi, want [dev]", got)
	}
	if got := parsed["both"].InputDrvs[drvs["multi"]]; !slices.Equal(got, []string{"dev", "out"}) {
		t.Errorf("both selects %q of multi, want [dev out]", got)
	}
	if len(consumer.InputSrcs) != 1 || !strings.HasSuffix(consumer.InputSrcs[0], "-script.sh") {
		t.Errorf("consumer InputSrcs = %q, want the script", consumer.InputSrcs)
	}
	if got := consumer.RequiredSystemFeatures(); !slices.Equal(got, []string{"kvm", "big-parallel"}) {
		t.Errorf("RequiredSystemFeatures() = %q, want [kvm big-parallel]", got)
	}
	if got := multi.RequiredSystemFeatures(); got != nil {
		t.Errorf("RequiredSystemFeatures() without any = %q, want nil", got)
	}
	if got := parsed["structured"].RequiredSystemFeatures(); !slices.Equal(got, []string{"kvm"}) {
		t.Errorf("structured RequiredSystemFeatures() = %q, want [kvm]", got)
	}
	sum := sha256.Sum256([]byte("x"))
	if got, want := parsed["fixed"].Outputs["out"], (DerivationOutput{Path: parsed["fixed"].Env["out"], HashAlgo: "sha256", Hash: hex.EncodeToString(sum[:])}); got != want {
		t.Errorf("fixed output = %+v, want %+v", got, want)
	}
}

func TestReadDerivationChrootStore(t *testing.T) {
	skipWithoutNixInstantiate(t)
	root := writableTempDir(t)
	drvs := instantiateTestDrvs(t, root)
	for _, attr := range testDrvAttrs(root) {
		d, err := ReadDerivation(root, drvs[attr])
		if err != nil {
			t.Fatalf("%s: %v", attr, err)
		}
		if want := showDerivation(t, root, drvs[attr]); !reflect.DeepEqual(d, want) {
			t.Errorf("%s: ReadDerivation = %+v, nix says %+v", attr, d, want)
		}
	}
	floating, err := ReadDerivation(root, drvs["floating"])
	if err != nil {
		t.Fatal(err)
	}
	if got, want := floating.Outputs["out"], (DerivationOutput{HashAlgo: "r:sha256"}); got != want {
		t.Errorf("floating CA output = %+v, want %+v", got, want)
	}
}

func TestReadDerivationErrors(t *testing.T) {
	root := t.TempDir()
	missing := StoreDir + "/" + strings.Repeat("0", HashPartLen) + "-missing.drv"
	if _, err := ReadDerivation(root, missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadDerivation of a missing file: %v, want fs.ErrNotExist", err)
	}
	for _, p := range []string{"/etc/passwd", StoreDir + "/../../etc/passwd", "relative.drv"} {
		if _, err := ReadDerivation(root, p); err == nil || !strings.Contains(err.Error(), "parse store path") {
			t.Errorf("ReadDerivation(%q) = %v, want a store path error", p, err)
		}
	}
	bad := StoreDir + "/" + strings.Repeat("1", HashPartLen) + "-bad.drv"
	writeFile(t, filepath.Join(root, bad), []byte("Derive(["), 0o444)
	_, err := ReadDerivation(root, bad)
	if err == nil || !strings.HasPrefix(err.Error(), "parse derivation "+bad+": byte 8:") {
		t.Errorf("ReadDerivation of a truncated file: %v, want it to name the path and offset", err)
	}
}

const (
	testOut = "/nix/store/nxpr4jqqi18580yx0ys1a81bq1l0mgjs-hci-a"
	testDep = "/nix/store/cvbal914fwybz9lhln4051zz31cryhc7-hci-a.drv"
	testSrc = "/nix/store/2pib33l1hin89krrb1d0c3x2mw62j6z1-script.sh"
	// minimalDrv is a small but complete derivation that the malformed cases below mutate.
	minimalDrv = `Derive([("out","` + testOut + `","","")],[("` + testDep + `",["dev","out"])],["` + testSrc + `"],"x86_64-linux","/bin/sh",["-c","echo \"hi\"\n"],[("name","hci-a"),("out","` + testOut + `")])`
)

func TestParseDerivationMinimal(t *testing.T) {
	d, err := ParseDerivation([]byte(minimalDrv))
	if err != nil {
		t.Fatal(err)
	}
	want := &Derivation{
		Outputs:   map[string]DerivationOutput{"out": {Path: testOut}},
		InputDrvs: map[string][]string{testDep: {"dev", "out"}},
		InputSrcs: []string{testSrc},
		Platform:  "x86_64-linux",
		Builder:   "/bin/sh",
		Args:      []string{"-c", "echo \"hi\"\n"},
		Env:       map[string]string{"name": "hci-a", "out": testOut},
	}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("ParseDerivation = %+v, want %+v", d, want)
	}
	if got := d.References(); !slices.Equal(got, []string{testSrc, testDep}) {
		t.Errorf("References() = %q", got)
	}
}

func TestParseDerivationMalformed(t *testing.T) {
	replace := func(old, new string) string {
		if !strings.Contains(minimalDrv, old) {
			panic("test case does not apply: " + old)
		}
		return strings.Replace(minimalDrv, old, new, 1)
	}
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", `byte 0: expected "Derive(", found end of input`},
		{"other format", `DrvWithVersion("xp-dyn-drv",[])`, `byte 0: expected "Derive("`},
		{"leading space", " " + minimalDrv, `byte 0: expected "Derive("`},
		{"trailing garbage", minimalDrv + "x", fmt.Sprintf(`byte %d: trailing data after derivation: "x"`, len(minimalDrv))},
		{"trailing newline", minimalDrv + "\n", fmt.Sprintf(`byte %d: trailing data after derivation: "\n"`, len(minimalDrv))},
		{"unterminated string", `Derive([("out`, `byte 9: unterminated string`},
		{"unterminated after backslash", `Derive([("out\`, `byte 9: unterminated string`},
		{"unterminated escaped quote", `Derive([("out\"`, `byte 9: unterminated string`},
		{"invalid escape", `Derive([("o\x","` + testOut + `","","")]`, `byte 11: invalid escape "\\x"`},
		{"missing comma", replace(`"out","/nix`, `"out" "/nix`), `byte 14: expected ",", found " \"/nix/store/nxp"…`},
		{"unclosed list", replace(`["-c",`, `["-c";`), `expected ',' or ']', found ";`},
		{"unquoted string", replace(`"x86_64-linux"`, `x86_64-linux`), fmt.Sprintf(`byte %d: expected "\"", found "x86_64-linux,\"/b"…`, strings.Index(minimalDrv, `"x86_64-linux"`))},
		{"output not in store", replace(`"out","/nix/store/nxpr`, `"out","/tmp/nxpr`), `byte 15: output "out": parse store path "/tmp/`},
		{"output bad hash part", replace(`nxpr4jqqi18580yx0ys1a81bq1l0mgjs-hci-a","",""`, `eeee4jqqi18580yx0ys1a81bq1l0mgjs-hci-a","",""`), `invalid hash part`},
		{"input drv not in store", replace(`("/nix/store/cvbal`, `("/nix/stor/cvbal`), fmt.Sprintf(`byte %d: parse store path "/nix/stor/`, strings.Index(minimalDrv, `"`+testDep))},
		{"input drv not a .drv", replace(`hci-a.drv"`, `hci-a"`), fmt.Sprintf(`byte %d: input derivation`, strings.Index(minimalDrv, `"`+testDep)) + ` "/nix/store/cvbal914fwybz9lhln4051zz31cryhc7-hci-a" is not a .drv`},
		{"input src not in store", replace(`"/nix/store/2pib`, `"/2pib`), `parse store path "/2pib`},
		{"input src path inside a store path", replace(`-script.sh"`, `-script.sh/x"`), `invalid character '/'`},
		{"no outputs", `Derive([],[],[],"s","b",[],[])`, `byte 9: derivation has no outputs`},
		{"empty output name", replace(`("out","/nix`, `("","/nix`), `byte 8: empty output name`},
		{"fixed output without path", replace(`"out","`+testOut+`","",""`, `"out","","sha256","abc"`), `byte 8: fixed output "out" needs a path`},
		{"duplicate output", replace(`[("out","`+testOut+`","","")]`, `[("out","`+testOut+`","",""),("out","`+testOut+`","","")]`), `duplicate output "out"`},
		{"duplicate input drv", replace(`["dev","out"])]`, `["dev","out"]),("`+testDep+`",["out"])]`), `duplicate input derivation`},
		{"duplicate env", replace(`[("name","hci-a")`, `[("name","hci-a"),("name","b")`), `duplicate environment variable "name"`},
		{"missing final paren", strings.TrimSuffix(minimalDrv, ")"), fmt.Sprintf(`byte %d: expected ")", found end of input`, len(minimalDrv)-1)},
		{"extra element in output", replace(`"","")]`, `"","","")]`), `expected ")"`},
		{"input drv outputs not a list", replace(`["dev","out"]`, `"dev"`), `expected "[", found "\"dev\"`},
		{"input drv output unquoted", replace(`["dev","out"]`, `[dev]`), `expected "\"", found "dev]`},
		{"env entry without value", replace(`("name","hci-a")`, `("name")`), `expected ",", found ")`},
		{"arg unterminated", minimalDrv[:strings.Index(minimalDrv, `echo`)], fmt.Sprintf(`byte %d: unterminated string`, strings.Index(minimalDrv, `echo`)-1)},
		{"invalid escape in env", replace(`"hci-a")`, `"hci\q")`), `invalid escape "\\q"`},
		{"first error wins", replace(`("out","/nix`, `("","/nix`) + "x", `byte 8: empty output name`},
		{"error inside a list ends it", replace(`["-c",`, `["-c",x,`), `expected "\"", found "x,`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := ParseDerivation([]byte(tt.in))
			if err == nil {
				t.Fatalf("ParseDerivation succeeded: %+v", d)
			}
			if !strings.HasPrefix(err.Error(), "parse derivation: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

// Every proper prefix of a valid derivation is invalid, and must fail cleanly.
func TestParseDerivationTruncated(t *testing.T) {
	for i := range len(minimalDrv) {
		if _, err := ParseDerivation([]byte(minimalDrv[:i])); err == nil {
			t.Errorf("prefix of length %d parsed", i)
		}
	}
}

func FuzzParseDerivation(f *testing.F) {
	f.Add([]byte(minimalDrv))
	f.Add([]byte(`Derive([("out","","r:sha256","")],[],[],"s","b",["a\\b\t"],[("k","v\r\n")])`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDerivation(b)
		if err != nil {
			return
		}
		for _, p := range d.References() {
			if _, err := ParseStorePath(p); err != nil {
				t.Errorf("accepted reference %q: %v", p, err)
			}
		}
	})
}

func BenchmarkParseDerivation(b *testing.B) {
	in := []byte(minimalDrv)
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := ParseDerivation(in); err != nil {
			b.Fatal(err)
		}
	}
}
