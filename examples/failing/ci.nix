# The README's second example: what a failure looks like. `tool` fails on purpose, `app` needs
# it and so is never built (dep-failed), and `lib` builds; `harmonia-ci run` shows all three and
# exits 1.
#
#   harmonia-ci run examples/failing
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

  lib = mk "failing-lib" [ ];
  tool = builtins.derivation {
    name = "broken-tool";
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" "echo 'compiling broken-tool'; echo 'error: this derivation fails on purpose' >&2; exit 1" ];
  };
in
{
  inherit lib tool;
  app = mk "broken-app" [ tool lib ];
}
