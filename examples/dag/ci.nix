# The example project of the README: a DAG of trivial derivations that harmonia-ci builds
# without nixpkgs (each builder is /bin/sh). Every attribute builds; examples/failing shows a
# failure.
#
#   harmonia-ci run examples/dag
let
  # mk NAME DEPS: an output holding NAME and the outputs of DEPS, line by line.
  mk = name: deps: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" ''
      echo "building ${name}"
      echo ${name} > $out
      ${builtins.concatStringsSep "\n" (map (d: ''while IFS= read -r line; do echo "$line" >> $out; done < ${d}'') deps)}
      echo "done: ${name}"
    '' ];
  };

  # Ten libraries, each on the previous two; eight tools on pairs of libraries, each with a
  # test; one release of all the tools.
  libs = builtins.genList (i: mk "lib-${toString i}" (
    if i == 0 then [ ] else if i == 1 then [ (builtins.elemAt libs 0) ]
    else [ (builtins.elemAt libs (i - 1)) (builtins.elemAt libs (i - 2)) ])) 10;
  tools = builtins.genList (i: mk "tool-${toString i}" [ (builtins.elemAt libs i) (builtins.elemAt libs (i + 2)) ]) 8;
  tests = map (t: mk "test-${t.name}" [ t ]) tools;
  named = xs: builtins.listToAttrs (map (d: { name = d.name; value = d; }) xs) // { recurseForDerivations = true; };
in
{
  libs = named libs;
  tools = named tools;
  tests = named tests;
  release = mk "release" tools;
}
