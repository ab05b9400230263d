# The flake's overlays, data-driven from python/rftstack/data/policy.toml and uv.lock.
#
#   cuda          nixpkgs overlay: cudaPackages_12_8 is the one CUDA package set
#   policy        Python (pyproject.nix set) overlay: [[relax]] and [[add]] applied to dist-info,
#                 [[patch]] applied to the installed sources
#   cuda12        Python overlay: the driver-570 flavour (CUDA 12 artifacts, CUDA 13 dists dropped),
#                 then its auto-patchelf plan (autopatchelf.nix)
#   cuda13        Python overlay: the plain PyPI CUDA 13 wheels, with their auto-patchelf plan
#   default       nixpkgs overlay adding `rftstack` (driver 570) and `rftstack-cuda13`
#
# # Type
#   import ./overlays { rs :: (import ../nix/lib { ... }); } -> AttrSet
{ rs, mkPackages ? null }:
let
  script = ../nix/scripts/dist-info-edit.sh;
  # patches.py runs in the build's bare Python next to policy.py; only these files enter the store.
  patchTool = {
    tool = builtins.path {
      name = "rftstack-patch-tool";
      path = ../python/rftstack/stack;
      filter = path: _type: builtins.elem (builtins.baseNameOf path) [ "patches.py" "policy.py" ];
    };
    policyFile = builtins.path { name = "policy.toml"; path = ../python/rftstack/data/policy.toml; };
    patchesDir = builtins.path { name = "rftstack-patches"; path = ../patches; };
  };
in
{
  cuda = import ./cuda.nix { inherit rs; };
  policy = import ./policy.nix { inherit rs script patchTool; };
  cuda12 =
    final: prev:
    let
      cuda12 = import ./cuda12.nix { inherit rs script; } final prev;
    in
    cuda12 // import ./autopatchelf.nix { inherit rs; flavour = "cuda12"; } final (prev // cuda12);
  cuda13 = import ./autopatchelf.nix { inherit rs; flavour = "cuda13"; };
  default =
    final: prev:
    if mkPackages == null then
      throw "rftstack: overlays.default needs the flake's package builder (use the flake's overlays.default)"
    else
      let
        out = mkPackages final;
      in
      {
        rftstack = out.cuda12;
        rftstack-cuda13 = out.cuda13;
      };
}
