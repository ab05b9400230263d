# Evaluation invariants of the flake, computed from uv.lock and policy.toml: a list of
# { name; ok :: Bool; message :: String } where `message` is the sentence shown on failure.
# Run by nix/tests/run.nix (nix/ci-check.sh) and by the flake's `checks.invariants`.
#
# # Type
#   import ./invariants.nix (import ./default.nix { ... }) -> [ { name; ok; message; } ]
rs:
let
  inherit (rs) lock policy dropped;
  inherit (rs.lib) lockLib;
  cuda12 = rs.flavours.cuda12;
  cuda13 = rs.flavours.cuda13;
  idx = lockLib.index lock;
  lockNames = map (p: p.name) lock.package;

  minus = a: b: builtins.filter (x: !(builtins.elem x b)) a;
  show = xs: if xs == [ ] then "none" else builtins.concatStringsSep ", " xs;

  # Lock dists that are CUDA 13 by their own metadata, independently of the drop list:
  # `-cu13` names; NVIDIA's unsuffixed CUDA wheels (nvidia-*, platform wheels, not `-cuNN`) whose
  # version major is 13 (nvidia-cublas 13.x, nvidia-nvjpeg 13.x: the CUDA 13 wheels on PyPI have no
  # suffix); cuda-toolkit 13.x and every dependency of any of its extras (nvidia-cufft 12.x is
  # CUDA 13's cuFFT); and every dependency of an extra named `cu13`. (Pure-Python nvidia-* dists
  # such as nvidia-ml-py 13.x are versioned by driver branch, not CUDA: they carry no library.)
  cuda13ByMetadata =
    let
      major = p: builtins.head (builtins.splitVersion p.version);
      platformWheel = p: builtins.any (w: builtins.match ".*-any\\.whl" w.url == null) (p.wheels or [ ]);
      unsuffixedNvidia13 =
        p:
        builtins.match "nvidia-.*" p.name != null
        && builtins.match ".*-cu[0-9]+" p.name == null
        && major p == "13"
        && platformWheel p;
      toolkit13 = builtins.filter (p: p.name == "cuda-toolkit" && major p == "13") lock.package;
      named = builtins.filter (
        p: builtins.match ".*-cu13" p.name != null || unsuffixedNvidia13 p
      ) (lock.package ++ toolkit13);
      viaExtra = builtins.concatMap (
        p: map (d: d.name) (p.optional-dependencies.cu13 or [ ])
      ) lock.package;
      viaToolkit = builtins.concatMap (
        p: map (d: d.name) (builtins.concatLists (builtins.attrValues (p.optional-dependencies or { })))
      ) toolkit13;
    in
    builtins.sort builtins.lessThan (
      builtins.attrNames (
        builtins.listToAttrs (
          map (n: { name = n; value = null; }) (map (p: p.name) named ++ viaExtra ++ viaToolkit)
        )
      )
    );

  artifactsIn = flavour: builtins.filter (p: p.a.hash == null && p.a.kind != "local") (
    map (p: { inherit (p) name version; a = lockLib.artifact rs.pyMinor p; }) flavour.packages
  );

  editsNotInClosure = builtins.filter (
    d: !(builtins.elem d cuda12.names) || !(builtins.elem d cuda13.names)
  ) (builtins.attrNames rs.edits);

  editsVersionMismatch = builtins.filter (
    d: builtins.all (p: p.version != rs.edits.${d}.version) (idx.byName.${d} or [ ])
  ) (builtins.attrNames rs.edits);

  policyEntries = (policy.relax or [ ]) ++ (policy.add or [ ]);
  notInEdits = builtins.filter (
    e:
    let
      ed = rs.edits.${rs.lib.policyLib.canonical e.dist} or null;
    in
    ed == null
    || !(
      (e ? was && builtins.elem { inherit (e) was now; } ed.replace)
      || (e ? requirement && builtins.elem e.requirement ed.add)
    )
  ) policyEntries;

  artifactMismatch = builtins.filter (
    a: builtins.all (p: p.version != a.replaces) (idx.byName.${a.name} or [ ])
  ) (builtins.attrValues rs.artifacts);

  badHash = builtins.filter (
    a: builtins.match "[0-9a-f]{64}" a.sha256 == null || builtins.match "https://.*" a.url == null
  ) (builtins.attrValues rs.artifacts);

  # Policy [[patch]] entries that the policy overlay does not apply as written: no patches dir, a
  # file missing or not matching its sha256, not in rs.patches, or a dist not in both closures at
  # the version the patch is for.
  patchNotApplied = builtins.filter (
    p:
    let
      dist = rs.lib.policyLib.canonical p.dist;
      file = rs.patchesDir + "/${p.file}";
    in
    rs.patchesDir == null
    || !(builtins.pathExists file)
    || builtins.hashFile "sha256" file != p.sha256
    || !(rs.patches ? ${dist})
    || !(builtins.elem p.file rs.patches.${dist}.files)
    || rs.patches.${dist}.version != p.version
    || !(builtins.elem dist cuda12.names)
    || !(builtins.elem dist cuda13.names)
    || builtins.all (l: l.version != p.version) (idx.byName.${dist} or [ ])
  ) (policy.patch or [ ]);

  missingReplacement = builtins.filter (
    d: d.replaced_by == "" && (d.why or "") == ""
  ) (policy.cuda12.drop or [ ]);
in
[
  {
    # The closure as the overlay builds it (edges removed only from `rs.rewritten`) against CUDA 13
    # dists found from the lock's own metadata, so a gap in the drop list shows here.
    name = "no-cuda13-dist-in-driver570-closure";
    ok = builtins.all (n: !(builtins.elem n (dropped ++ cuda13ByMetadata))) cuda12.names;
    message = "CUDA 13 distributions are still reachable in the driver-570 closure: ${show (builtins.filter (n: builtins.elem n (dropped ++ cuda13ByMetadata)) cuda12.names)}";
  }
  {
    name = "drop-list-covers-cuda13-metadata";
    ok = minus cuda13ByMetadata dropped == [ ];
    message = "uv.lock has CUDA 13 distributions that policy.toml [[cuda12.drop]] does not list: ${show (minus cuda13ByMetadata dropped)}";
  }
  {
    name = "drop-list-names-lock-dists";
    ok = minus dropped lockNames == [ ];
    message = "policy.toml [[cuda12.drop]] names distributions that uv.lock does not have: ${show (minus dropped lockNames)}";
  }
  {
    name = "every-drop-has-replacement-or-reason";
    ok = missingReplacement == [ ];
    message = "[[cuda12.drop]] entries without replaced_by nor why: ${show (map (d: d.dist) missingReplacement)}";
  }
  {
    name = "cuda12-artifacts-replace-locked-versions";
    ok = artifactMismatch == [ ];
    message = "policy.toml [[cuda12.artifact]] entries replace versions the lock does not pin: ${show (map (a: "${a.name} ${a.replaces}") artifactMismatch)}";
  }
  {
    name = "cuda12-artifacts-have-sha256-and-https";
    ok = badHash == [ ];
    message = "CUDA 12 artifacts without a 64-hex sha256 or an https URL: ${show (map (a: a.name) badHash)}";
  }
  {
    name = "every-policy-edit-is-applied";
    ok = notInEdits == [ ];
    message = "policy.toml entries that the metadata overlay does not apply: ${show (map (e: e.dist) notInEdits)}";
  }
  {
    name = "policy-edits-target-installed-dists";
    ok = editsNotInClosure == [ ] && editsVersionMismatch == [ ];
    message = "policy.toml edits dists that are not in both flavours' closures (${show editsNotInClosure}) or not at the locked version (${show editsVersionMismatch})";
  }
  {
    name = "every-policy-patch-is-applied";
    ok = patchNotApplied == [ ];
    message = "policy.toml [[patch]] entries the policy overlay does not apply (patches dir missing, file missing or not at its sha256, or a dist not in both closures at the patched version): ${show (map (p: "${p.dist} ${p.file}") patchNotApplied)}";
  }
  {
    name = "every-fetched-file-has-a-hash-cuda12";
    ok = artifactsIn cuda12 == [ ];
    message = "driver-570 closure packages fetched without a hash in uv.lock: ${show (map (p: p.name) (artifactsIn cuda12))}";
  }
  {
    name = "every-fetched-file-has-a-hash-cuda13";
    ok = artifactsIn cuda13 == [ ];
    message = "cuda13 closure packages fetched without a hash in uv.lock: ${show (map (p: p.name) (artifactsIn cuda13))}";
  }
  {
    name = "every-closure-package-has-an-installable-file";
    ok = builtins.all (p: (lockLib.artifact rs.pyMinor p).kind != "none") cuda13.packages;
    message = "closure packages with neither a fitting wheel nor an sdist: ${show (map (p: p.name) (builtins.filter (p: (lockLib.artifact rs.pyMinor p).kind == "none") cuda13.packages))}";
  }
]
