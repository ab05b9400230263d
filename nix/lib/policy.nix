# python/rftstack/data/policy.toml, read with builtins.fromTOML, and the decisions the flake
# takes from it. Values are never retyped here: every string comes from the TOML.
let
  # Shell-quote a string (same rule as nixpkgs' lib.escapeShellArg, without nixpkgs).
  q = s: "'${builtins.replaceStrings [ "'" ] [ "'\\''" ] s}'";

  # PEP 503 normalisation: lower case, runs of -_. become one -.
  canonical =
    name:
    let
      lower = builtins.replaceStrings
        (builtins.genList (i: builtins.substring i 1 "ABCDEFGHIJKLMNOPQRSTUVWXYZ") 26)
        (builtins.genList (i: builtins.substring i 1 "abcdefghijklmnopqrstuvwxyz") 26)
        name;
    in
    builtins.concatStringsSep "-" (
      builtins.filter (s: builtins.isString s && s != "") (builtins.split "[-_.]+" lower)
    );

  # A policy glob (`*` = any run of name characters) as a POSIX ERE fragment.
  globToEre =
    glob:
    builtins.concatStringsSep "[A-Za-z0-9._-]*" (
      map (builtins.replaceStrings [ "." ] [ "[.]" ]) (
        builtins.filter builtins.isString (builtins.split "\\*" glob)
      )
    );
in
rec {
  inherit canonical q;

  # Read the policy file.
  #
  # # Type
  #   read :: Path -> AttrSet
  read = path: builtins.fromTOML (builtins.readFile path);

  # Names of the distributions the driver-570 flavour drops ([[cuda12.drop]] dist).
  #
  # # Type
  #   droppedNames :: Policy -> [String]
  droppedNames = policy: map (d: canonical d.dist) (policy.cuda12.drop or [ ]);

  # The CUDA 12 artifacts by distribution name.
  #
  # # Type
  #   artifacts :: Policy -> AttrSet (name -> { name, version, replaces, url, sha256, ... })
  artifacts =
    policy:
    builtins.listToAttrs (
      map (a: { name = canonical a.name; value = a; }) (policy.cuda12.artifact or [ ])
    );

  # cudaPackages_12_8 attribute names that replace the dropped wheels (deduplicated, sorted).
  #
  # # Type
  #   replacementLibraries :: Policy -> [String]
  #
  # # Example
  #   replacementLibraries policy => [ "cuda_cccl" "cuda_cudart" ... "nccl" ]
  replacementLibraries =
    policy:
    builtins.attrNames (
      builtins.listToAttrs (
        map (d: { name = d.replaced_by; value = null; }) (
          builtins.filter (d: d.replaced_by != "") (policy.cuda12.drop or [ ])
        )
      )
    );

  # Per distribution: the metadata edits the policy asks for ([[relax]] and [[add]]).
  #
  # # Type
  #   edits :: Policy -> AttrSet (dist -> { version; replace :: [{was, now}]; add :: [String] })
  #
  # # Example
  #   (edits policy).verl => { version = "0.8.0"; replace = [ { was = "numpy<2.0.0"; now = "numpy<2.4,>=2"; } ]; add = [ ]; }
  edits =
    policy:
    let
      relax = policy.relax or [ ];
      add = policy.add or [ ];
      dists = builtins.attrNames (
        builtins.listToAttrs (map (e: { name = canonical e.dist; value = null; }) (relax ++ add))
      );
      one =
        dist:
        let
          rs = builtins.filter (r: canonical r.dist == dist) relax;
          as = builtins.filter (a: canonical a.dist == dist) add;
          versions = builtins.attrNames (
            builtins.listToAttrs (map (e: { name = e.version; value = null; }) (rs ++ as))
          );
        in
        if builtins.length versions != 1 then
          throw "rftstack: policy.toml names ${dist} with several versions (${toString versions}); one dist, one version"
        else
          {
            version = builtins.head versions;
            replace = map (r: { inherit (r) was now; }) rs;
            add = map (a: a.requirement) as;
          };
    in
    builtins.listToAttrs (map (d: { name = d; value = one d; }) dists);

  # The shell command that applies a dist's edits to its installed dist-info, run from a
  # derivation's postInstall with nix/scripts/dist-info-edit.sh. Arguments are quoted here, so
  # the TOML's strings reach the script unchanged.
  #
  # # Type
  #   editCommand :: { script :: String; python :: String; site :: String } -> String -> Edit -> String
  #
  # # Example
  #   editCommand { script = "edit.sh"; python = "python3"; site = "$out/lib/python3.12/site-packages"; }
  #     "verl" (edits policy).verl
  #   => "bash edit.sh 'python3' '$out/...' 'verl' '0.8.0' --replace 'numpy<2.0.0' 'numpy<2.4,>=2'"
  editCommand =
    { script, python, site }:
    dist: e:
    builtins.concatStringsSep " " (
      [ "bash" script (q python) "\"${site}\"" (q dist) (q e.version) ]
      ++ builtins.concatMap (r: [ "--replace" (q r.was) (q r.now) ]) e.replace
      ++ builtins.concatMap (a: [ "--add" (q a) ]) e.add
    );

  # The command that removes the artifacts' Requires-Dist lines named by cuda12.strip_requires.
  #
  # # Type
  #   stripCommand :: { script, python, site } -> Policy -> String -> String -> String
  stripCommand =
    { script, python, site }:
    policy: dist: version:
    builtins.concatStringsSep " " (
      [ "bash" script (q python) "\"${site}\"" (q dist) (q version) ]
      ++ builtins.concatMap (g: [ "--strip" (q (globToEre g)) ]) (policy.cuda12.strip_requires or [ ])
    );

  inherit globToEre;
}
