// Package nixgen writes Nix expressions of trivial /bin/sh derivations, which real Nix
// evaluates and builds offline (no nixpkgs): the projects of tests, benchmarks and examples.
package nixgen

import (
	"fmt"
	"strconv"
	"strings"
)

// Lib is a Nix prelude defining mk: mk NAME DEPS is a derivation whose output lists its name and
// then its dependencies' outputs. salt changes every derivation's hash.
func Lib(salt string) string { return lib(salt, "") }

// lib is Lib whose mk builders run the shell command pre first.
func lib(salt, pre string) string {
	return `let
  mk = name: deps: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    salt = "` + salt + `";
    args = [ "-c" "` + pre + `echo building ${name}; echo ${name} > $out; ${builtins.concatStringsSep ""
      (map (d: "while IFS= read -r l; do echo \"$l\" >> $out; done < ${d};") deps)}" ];
  };
  fail = name: deps: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    salt = "` + salt + `";
    args = [ "-c" "echo failing ${name} >&2; exit 1" ];
    inherit deps;
  };
in`
}

// Layered returns a Nix expression (an attribute set d0…d(n-1)) of n derivations in layers of
// width, each depending on two derivations of the layer below: wide and deep.
func Layered(salt string, n, width int) string {
	return layered(Lib(salt), n, width)
}

// LayeredSleep is Layered whose builds each run /bin/sleep for seconds first (the end-to-end
// benchmark's slow workload). Builds in a chroot store need /bin/sleep among their sandbox
// paths.
func LayeredSleep(salt string, n, width int, seconds float64) string {
	return layered(lib(salt, "/bin/sleep "+strconv.FormatFloat(seconds, 'f', -1, 64)+"; "), n, width)
}

func layered(prelude string, n, width int) string {
	return prelude + fmt.Sprintf(`
let
  n = %d; width = %d;
  mod = a: b: a - (a / b) * b;
  layer = prev: l: builtins.genList (j: mk "d${toString (l * width + j)}"
    (if prev == [ ] then [ ] else [ (builtins.elemAt prev j) (builtins.elemAt prev (mod (j * 7 + 3) width)) ])) width;
  layers = builtins.foldl' (acc: l: acc ++ [ (layer (if acc == [ ] then [ ] else builtins.elemAt acc (l - 1)) l) ])
    [ ] (builtins.genList (l: l) (n / width));
in builtins.listToAttrs (map (d: { name = d.name; value = d; }) (builtins.concatLists layers))
`, n, width)
}

// Deep returns a Nix expression of a deep, wide DAG whose builds each run /bin/sleep for seconds
// first: leaves independent derivations (attributes leaf-000…, numbered with at least three
// digits so that name order is index order) and a chain of chain links (spine-000 ← spine-001 ←
// …, each depending on the one before) exposed as the attribute spine, its last link.
// Evaluators walk attributes in name order, so the chain comes after every leaf: its base is
// enqueued behind them. The chain's links are the critical path. Builds in a chroot store need
// /bin/sleep among their sandbox paths.
func Deep(salt string, leaves, chain int, seconds float64) string {
	digits := max(3, len(strconv.Itoa(max(leaves, chain)-1)))
	prelude := lib(salt, "/bin/sleep "+strconv.FormatFloat(seconds, 'f', -1, 64)+"; ")
	return prelude + fmt.Sprintf(`
let
  leaves = %d; chain = %d; zeros = "%s";
  pad = i: let s = toString i; in builtins.substring 0 (builtins.stringLength zeros - builtins.stringLength s) zeros + s;
  leafAttrs = builtins.genList (i: let d = mk "leaf-${pad i}" [ ]; in { name = d.name; value = d; }) leaves;
  link = i: mk "spine-${pad i}" (if i == 0 then [ ] else [ (link (i - 1)) ]);
in builtins.listToAttrs leafAttrs // (if chain > 0 then { spine = link (chain - 1); } else { })
`, leaves, chain, strings.Repeat("0", digits))
}
