# The evaluator's walk over a project's attributes: the facts nix-eval-jobs reports, from plain
# Nix. Every record is a trace line "@hci:<nonce> <json>" on stderr, written as the walk goes, so the
# evaluator ingests while Nix evaluates. A catchable error (throw, assert) is recorded on its
# attribute; an uncatchable one stops Nix right after the "begin" record of the attribute at
# fault, and the evaluator runs the walk again with that attribute (and everything already
# reported) in spec.skip. The nonce is an argument, which the project's code cannot see: its own
# traces cannot pass for records.
#
# Several walkers share one evaluation through units (spec.units): a unit is an attribute path,
# the levels below it walked without recurseForDerivations (force) and, for a slice of a set, the
# names of the children to walk. With spec.split > 0 a set the walk would recurse into that has
# more children than that is not walked: it is reported ("split") for the evaluator to cut into
# units other walkers take.
{ specFile, nonce }:
let
  spec = builtins.fromJSON (builtins.readFile specFile);
  skip = builtins.listToAttrs (map (a: { name = a; value = true; }) spec.skip);
  say = msg: builtins.trace ("@hci:" + nonce + " " + builtins.toJSON msg);
  # emit reports an attribute at once, inside the walk of that attribute: the record streams to
  # the evaluator while Nix goes on, and an uncatchable error is never blamed on the attribute
  # that began before it.
  emit = msg: let r = say msg null; in builtins.seq r [ r ];

  root =
    if spec.mode == "flake" then
      let f = builtins.getFlake spec.flakeRef; in f.outputs or f
    else
      # The commit's tree, exported by the evaluator into a directory named "source", so
      # that ./. copied into the store is the path builtins.fetchGit would give.
      let raw = import (/. + "${spec.source}/${spec.file}");
      in if builtins.isFunction raw then raw { } else raw;

  isDrv = x: builtins.isAttrs x && (x.type or null) == "derivation";
  quote = n: if builtins.match "[a-zA-Z_][a-zA-Z0-9_'-]*" n != null then n else builtins.toJSON n;
  render = path: builtins.concatStringsSep "." (map quote path);

  # force: levels below a root that are walked without recurseForDerivations.
  walk = force: path: x:
    let a = render path; in
    if skip ? ${a} then [ ] else
    say { begin = a; inherit path; } (
      let t = builtins.tryEval x; in
      if !t.success then emit { attr = a; inherit path; failed = true; }
      else if isDrv t.value then
        let d = builtins.tryEval t.value.drvPath; in
        emit (if d.success then { attr = a; inherit path; drv = d.value; } else { attr = a; inherit path; failed = true; })
      else if builtins.isAttrs t.value && (force > 0 || (t.value.recurseForDerivations or false) == true) then
        let names = builtins.filter (n: n != "recurseForDerivations") (builtins.attrNames t.value); in
        if split > 0 && builtins.length names > split then emit { split = a; inherit path force names; }
        else children force path t.value names
      else [ ]);

  children = force: path: v: builtins.concatMap (n: walk (force - 1) (path ++ [ n ]) v.${n});

  lookup = path: builtins.foldl' (acc: n:
    if acc.found && builtins.isAttrs acc.value && acc.value ? ${n}
    then { found = true; value = acc.value.${n}; } else { found = false; value = null; })
    { found = true; value = root; } path;

  # walkUnit walks a unit: the attribute at its path, or the named children of the set there.
  walkUnit = u:
    let
      path = u.path;
      a = render path;
      l = lookup path;
    in
    if u.names or null != null then children u.force path l.value u.names
    else if path == [ ] then walk u.force [ ] root
    else if skip ? ${a} then [ ]
    else say { begin = a; inherit path; } (
      if l.found then walk u.force path l.value
      else emit { attr = a; inherit path; error = "attribute '${a}' does not exist"; });

  split = spec.split or 0;
  units = spec.units or (map (path: { inherit path; inherit (spec) force; }) spec.roots);

  # probe: evaluate one attribute without tryEval, so Nix prints the real error.
  probe = let l = lookup spec.probe; in l.value.drvPath;

  count = builtins.foldl' (acc: e: builtins.seq e (acc + 1)) 0;
in
if spec ? probe then probe
else builtins.seq root (say { walk = true; } (count (builtins.concatMap walkUnit units)))
