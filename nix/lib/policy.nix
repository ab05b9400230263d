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

  # Per distribution: the policy's source patches ([[patch]]). Each patch file's sha256 is checked
  # here, at evaluation, against the policy (a changed file stops the build before anything runs);
  # patches.py checks it again when it applies the patch, together with every hunk's context.
  #
  # # Type
  #   patches :: Policy -> Path -> AttrSet (dist -> { version :: String; files :: [String] })
  #
  # # Example
  #   patches policy ./patches => { torch = { version = "2.11.0"; files = [ "torch-tcpstore-loopback.patch" ]; }; }
  patches =
    policy: patchesDir:
    let
      ps = policy.patch or [ ];
      checked =
        p:
        let
          got = builtins.hashFile "sha256" (patchesDir + "/${p.file}");
        in
        if got != p.sha256 then
          throw "rftstack: patches/${p.file} has sha256 ${got} but policy.toml says ${p.sha256}; restore the file or update the policy"
        else
          p.file;
      dists = builtins.attrNames (builtins.listToAttrs (map (p: { name = canonical p.dist; value = null; }) ps));
      one =
        dist:
        let
          mine = builtins.filter (p: canonical p.dist == dist) ps;
          versions = builtins.attrNames (builtins.listToAttrs (map (p: { name = p.version; value = null; }) mine));
        in
        if builtins.length versions != 1 then
          throw "rftstack: policy.toml patches ${dist} for several versions (${toString versions}); one dist, one version"
        else
          {
            version = builtins.head versions;
            files = map checked mine;
          };
    in
    builtins.listToAttrs (map (d: { name = d; value = one d; }) dists);

  # The shell command that applies a dist's policy patches to its installed files, run from a
  # derivation's postInstall: python/rftstack/stack/patches.py (next to policy.py, standard library
  # only) with --dist, so only this derivation's patches are applied; strict (exact context, the
  # installed version and the file's sha256 checked), RECORD re-hashed; a mismatch fails the build.
  #
  # # Type
  #   patchCommand :: { tool :: String; python :: String; site :: String; policyFile :: String; patchesDir :: String } -> String -> String
  #
  # # Example
  #   patchCommand { tool = "/nix/store/...-tool"; python = "py"; site = "$out/site"; policyFile = "p.toml"; patchesDir = "pd"; } "torch"
  #   => "'py' '/nix/store/...-tool/patches.py' \"$out/site\" --policy 'p.toml' --patches 'pd' --dist 'torch'"
  patchCommand =
    { tool, python, site, policyFile, patchesDir }:
    dist:
    builtins.concatStringsSep " " [
      (q python) (q "${tool}/patches.py") "\"${site}\"" "--policy" (q policyFile) "--patches" (q patchesDir) "--dist" (q dist)
    ];

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
