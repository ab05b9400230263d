# What nixpkgs' auto-patchelf is given for each package of a flavour, from nix/data/libraries.toml
# and uv.lock: the wheels keep their shared objects under site-packages, which auto-patchelf never
# searches (it adds only `<input>/lib`), so every package gets, as `addAutoPatchelfSearchPath`
# folders, the [libdirs] of the distributions in its own dependency closure; plus the nixpkgs
# libraries and libpython its [[needs]] name, the CUDA 12.8 libraries (CUDA 12 artifacts only),
# and the host driver's libraries and the [[ignore]] names as autoPatchelfIgnoreMissingDeps.
# The overlays apply exactly this plan (overlays/autopatchelf.nix); the flake exports it as
# `lib.autoPatchelf` and python/rftstack/stack/autopatchelf.py resolves real ELF files against it.
#
# # Type
#   import ./autopatchelf.nix { libraries :: AttrSet; lock; environ; closure; artifacts; cudaLibraries :: [String]; }
#     -> { plan :: { flavour :: String; packages :: [Package]; dropEdge :: (String -> String -> Bool); cuda :: Bool; }
#                  -> AttrSet (name -> { searchPaths :: [{ dist; dir; }]; nixpkgs :: [String];
#                                        python :: Bool; cuda :: [String]; ignoreMissing :: [String]; }) }
#
# # Example
#   (plan { flavour = "cuda13"; packages = rs.flavours.cuda13.packages; dropEdge = _: _: false; cuda = false; }).vllm.searchPaths
#     => [ { dist = "nvidia-cublas"; dir = "nvidia/cu13/lib"; } ... { dist = "torch"; dir = "torch/lib"; } ]
{
  libraries,
  lock,
  environ,
  closure,
  artifacts,
  cudaLibraries,
}:
let
  libdirs = libraries.libdirs or { };
  needs = libraries.needs or [ ];
  ignores = libraries.ignore or [ ];
  needsOf = name: builtins.filter (n: builtins.elem name n.dists) needs;
  unique = xs: builtins.attrNames (builtins.listToAttrs (map (x: { name = x; value = null; }) xs));

  planOf =
    { dropEdge, cuda, byName, flavour }:
    pkg:
    let
      closureOf = p: closure.names (closure.walk { inherit lock environ dropEdge; root = p.name; rootPackage = p; });
      linked = builtins.concatMap (n: if byName ? ${n} then [ byName.${n} ] else [ ]) (
        builtins.concatMap (n: n.links or [ ]) (needsOf pkg.name)
      );
      deps = builtins.filter (n: n != pkg.name) (unique (builtins.concatMap closureOf ([ pkg ] ++ linked)));
      withDirs = builtins.filter (d: libdirs ? ${d}) deps;
    in
    {
      searchPaths = builtins.concatMap (d: map (dir: { dist = d; inherit dir; }) libdirs.${d}) withDirs;
      nixpkgs = unique (builtins.concatMap (n: n.nixpkgs or [ ]) (needsOf pkg.name));
      python = builtins.any (n: n.python or false) (needsOf pkg.name);
      cuda = if cuda && artifacts ? ${pkg.name} then cudaLibraries else [ ];
      ignoreMissing = unique (
        libraries.driver.names
        ++ builtins.concatMap (
          i: if i.dist == pkg.name && (i.flavour or flavour) == flavour then i.names else [ ]
        ) ignores
      );
    };
in
{
  plan =
    { flavour, packages, dropEdge, cuda }:
    let
      byName = builtins.listToAttrs (map (p: { name = p.name; value = p; }) packages);
    in
    builtins.listToAttrs (map (p: { name = p.name; value = planOf { inherit dropEdge cuda byName flavour; } p; }) packages);
}
