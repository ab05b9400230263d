#!/usr/bin/env bash
# Evaluate every flake output to a .drv path against the real pyproject.nix, uv2nix,
# build-system-pkgs and nixpkgs.lib, and the TEST STAND-IN for the rest of nixpkgs
# (nix/testing/nixpkgs-stand-in). Needs the four repositories as bare git dirs under MIRROR
# (MIRROR/<owner>+<name>/repo). Builds nothing. Output: JSON on stdout.
# The flake is read as git+file: tracked files only (a path: flake would copy an untracked .venv).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mirror=${MIRROR:?set MIRROR to the folder holding the bare git dirs <owner>+<name>/repo of pyproject.nix, uv2nix, build-system-pkgs and nixpkgs.lib}
work=${WORK:-/tmp/rftstack-eval}
NIX=(nix --extra-experimental-features 'nix-command flakes')
rm -rf "$work"; mkdir -p "$work"
rev_of() { git --git-dir="$mirror/$1/repo" rev-parse HEAD; }
tree() { mkdir -p "$work/$2"; git --git-dir="$mirror/$1/repo" archive HEAD | tar -x -C "$work/$2"; }
tree pyproject-nix+pyproject.nix pyproject.nix
tree pyproject-nix+uv2nix uv2nix
tree pyproject-nix+build-system-pkgs build-system-pkgs
tree nix-community+nixpkgs.lib nixpkgs.lib
cp -r "$repo/nix/testing/nixpkgs-stand-in" "$work/nixpkgs-stand-in"
cp -r "$work/nixpkgs.lib/lib" "$work/nixpkgs-stand-in/lib"
for r in pyproject-nix+pyproject.nix pyproject-nix+uv2nix pyproject-nix+build-system-pkgs nix-community+nixpkgs.lib; do
  echo "# $r $(rev_of $r)" >&2
done
over=(--no-write-lock-file
  --override-input nixpkgs "path:$work/nixpkgs-stand-in"
  --override-input pyproject-nix "path:$work/pyproject.nix"
  --override-input uv2nix "path:$work/uv2nix"
  --override-input pyproject-build-systems "path:$work/build-system-pkgs")
"${NIX[@]}" eval --impure --json "${over[@]}" "git+file://$repo#." --apply '
  f: let
    drvs = builtins.mapAttrs (_: d: d.drvPath);
    s = "x86_64-linux";
  in {
    packages = drvs f.packages.${s};
    checks = drvs f.checks.${s};
    gpuCheck = {
      drv = f.packages.${s}.default.gpuCheck.drvPath;
      requiredSystemFeatures = f.packages.${s}.default.gpuCheck.requiredSystemFeatures;
      checksNeedingFeatures = builtins.filter (n: (f.checks.${s}.${n}.requiredSystemFeatures or [ ]) != [ ]) (builtins.attrNames f.checks.${s});
    };
    devShells = drvs f.devShells.${s};
    apps = builtins.mapAttrs (_: a: a.program) f.apps.${s};
    overlays = builtins.mapAttrs (_: o: builtins.isFunction o) f.overlays;
    overlayDefault = (import '"$work"'/nixpkgs-stand-in { overlays = [ f.overlays.default ]; }).rftstack.drvPath;
    sources = builtins.mapAttrs (_: set: {
      torch = set.torch.src.passthru.url;
      vllm = set.vllm.src.passthru.url;
      torchDeps = builtins.attrNames set.torch.passthru.dependencies;
      verlPostInstall = set.verl.postInstall or "";
      trinityPostInstall = set.trinity-rft.postInstall or "";
      torchPostInstall = set.torch.postInstall or "";
      torchBuildInputs = map (d: d.name) (set.torch.buildInputs or [ ]);
      # the resolver of pyproject.nix over the env spec vs the walk of nix/lib: same names?
      closureMatchesNixLib =
        let
          resolved = builtins.sort builtins.lessThan (map (d: d.pname) (set.resolveVirtualEnv { rftstack = [ ]; }));
        in
        resolved == f.lib.flavours.${if set.torch.passthru ? rftstackArtifact then "cuda12" else "cuda13"}.names;
      droppedIsError = !(builtins.tryEval (set.nvidia-cudnn-cu13.drvPath)).success;
      # auto-patchelf: the search paths nix/lib plans are in the preFixup of each wheel
      searchPathsApplied =
        let
          flavour = if set.torch.passthru ? rftstackArtifact then "cuda12" else "cuda13";
          plan = f.lib.autoPatchelf.${flavour};
          wheels = builtins.filter (n: set ? ${n} && (set.${n}.passthru.format or null) == "wheel") (builtins.attrNames plan);
          ok = n: builtins.all (d: builtins.match ".*/${d.dir}.*" (set.${n}.preFixup or "") != null) plan.${n}.searchPaths;
        in
        builtins.filter (n: !(ok n)) wheels == [ ];
      vllmPreFixup = set.vllm.preFixup or "";
    }) f.legacyPackages.${s}.pythonSets;
  }' 
