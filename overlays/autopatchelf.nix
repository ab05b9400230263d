# Python overlay of one flavour: nix/lib/autopatchelf.nix's plan applied to every wheel of the
# closure. nixpkgs' auto-patchelf searches only `<input>/lib` of the buildInputs, and the wheels
# keep their shared objects under lib/python3.12/site-packages/... (torch/lib/libtorch*.so,
# nvidia/cu13/lib/libcudart.so.13, ...), so each wheel gets:
#   - `addAutoPatchelfSearchPath <dist>/<site-packages>/<dir>` for the [libdirs] of the
#     distributions in its own dependency closure (nix/data/libraries.toml);
#   - the nixpkgs libraries and libpython its [[needs]] name, and for the CUDA 12 artifacts the
#     cudaPackages_12_8 libraries, as buildInputs;
#   - the host driver's libraries and its [[ignore]] names as autoPatchelfIgnoreMissingDeps.
# Packages built from an sdist are left alone (no auto-patchelf runs there).
#
# # Type
#   import ./autopatchelf.nix { rs; flavour :: "cuda12" | "cuda13"; } -> (final: prev: AttrSet)
{ rs, flavour }:
final: prev:
let
  plan = rs.autoPatchelf.${flavour};
  cudaAttr = "cudaPackages_" + builtins.replaceStrings [ "." ] [ "_" ] rs.policy.cuda12.cuda;
  site = final.python.sitePackages;
  searchLine = d: "addAutoPatchelfSearchPath ${final.${d.dist}}/${site}/${d.dir}";
  apply =
    name: p:
    prev.${name}.overrideAttrs (
      old:
      if (old.passthru.format or null) != "wheel" then
        { }
      else
        {
          buildInputs =
            (old.buildInputs or [ ])
            ++ map (a: final.pkgs.${a}) p.nixpkgs
            ++ (if p.python then [ final.python ] else [ ])
            ++ map (a: final.pkgs.${cudaAttr}.${a}) p.cuda;
          autoPatchelfIgnoreMissingDeps = (old.autoPatchelfIgnoreMissingDeps or [ ]) ++ p.ignoreMissing;
          preFixup = builtins.concatStringsSep "\n" ([ (old.preFixup or "") ] ++ map searchLine p.searchPaths);
          passthru = old.passthru // {
            rftstackAutoPatchelf = p;
          };
        }
    );
in
builtins.mapAttrs apply (removeAttrs plan (builtins.filter (n: !(prev ? ${n})) (builtins.attrNames plan)))
