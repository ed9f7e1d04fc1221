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

// PackageSet returns a Nix expression shaped like nixpkgs, of about n derivations (at least
// 200): a bootstrap chain of 40 stages ending in stdenv; n/25 low-level libraries (attributes
// lib0…), each on stdenv and on up to two earlier libraries, so that chains run deep; and
// packages, each built from a fixed-output source of its own (a derivation too) and three
// libraries. Six packages in ten are top-level attributes (pkg…); the others are in
// recurseForDerivations sets: pythonPackages, perlPackages and haskellPackages, whose
// packages sit one level further down in seven groups. With throws, a few attributes throw
// (top-level and in pythonPackages), as broken packages do; bare nix-instantiate stops at the
// first of them, so the benchmark gives it the set without.
func PackageSet(salt string, n int, throws bool) string {
	const stages = 40
	libs := max(n/25, 4)
	pkgs := max((n-stages-libs)/2, 1)
	thrower := "false"
	if throws {
		thrower = "true"
	}
	return Lib(salt) + fmt.Sprintf(`
let
  stages = %d; nlibs = %d; npkgs = %d; throws = %s; salt = "%s";
  mod = a: b: a - (a / b) * b;
  stage = i: mk "stdenv-stage${toString i}" (if i == 0 then [ ] else [ (stage (i - 1)) ]);
  stdenv = stage (stages - 1);
  libs = builtins.genList (i: mk "lib${toString i}" ([ stdenv ]
    ++ (if i == 0 then [ ] else [ (builtins.elemAt libs (i - 1 - mod (i * 7) (if i < 50 then i else 50))) ])
    ++ (if i < 2 then [ ] else [ (builtins.elemAt libs (i / 2)) ]))) nlibs;
  src = i: let content = "source ${salt} ${toString i}"; in builtins.derivation {
    name = "src${toString i}";
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" "printf %%s '${content}' > $out" ];
    outputHashMode = "flat";
    outputHashAlgo = "sha256";
    outputHash = builtins.hashString "sha256" content;
  };
  lib = j: builtins.elemAt libs (mod j nlibs);
  pkg = i: mk "pkg${toString i}" [ (src i) (lib (i * 13)) (lib (i * 31 + 7)) (lib (i * 101 + 3)) ];
  named = f: is: builtins.listToAttrs (map (i: { name = "pkg${toString i}"; value = f i; }) is);
  where = k: builtins.filter (i: mod i 10 == k) (builtins.genList (i: i) npkgs);
  topLevel = builtins.filter (i: mod i 10 < 6) (builtins.genList (i: i) npkgs);
  broken = k: throw "broken package ${toString k}";
  set = attrs: attrs // { recurseForDerivations = true; };
in
  builtins.listToAttrs (builtins.genList (i: { name = "lib${toString i}"; value = builtins.elemAt libs i; }) nlibs)
  // named pkg topLevel
  // {
    inherit stdenv;
    pythonPackages = set (named pkg (where 6 ++ where 7)
      // (if throws then { broken = broken 100; } else { }));
    perlPackages = set (named pkg (where 8));
    haskellPackages = set (builtins.listToAttrs (builtins.genList (g: {
      name = "group${toString g}";
      value = set (named pkg (builtins.filter (i: mod (i / 10) 7 == g) (where 9)));
    }) 7));
  }
  // (if throws then builtins.listToAttrs (builtins.genList (k: { name = "broken${toString k}"; value = broken k; }) 5) else { })
`, stages, libs, pkgs, thrower, salt)
}
