# Python overlay of the driver-570 flavour, from policy.toml [cuda12]:
#   - torch/torchvision/torchaudio/vllm come from the CUDA 12 artifacts (fetchurl with the
#     policy's url + sha256); their Requires-Dist on nvidia-*-cu12 wheels (cuda12.strip_requires)
#     is removed, and the CUDA libraries come from cudaPackages_12_8 instead (replaced_by);
#   - every edge to a [[cuda12.drop]] dist is removed from the packages nix/lib names
#     (`rs.rewritten`), and the dropped dists themselves become an evaluation error, so nothing
#     in the closure can pull a CUDA 13 library back in;
#   - what auto-patchelf gets (the cudaPackages_12_8 libraries as the artifacts' buildInputs, search
#     paths, the driver's libraries left unresolved) is added after this overlay by
#     autopatchelf.nix (overlays/default.nix composes them).
#
# # Type
#   import ./cuda12.nix { rs; script :: Path; } -> (final: prev: AttrSet)
{ rs, script }:
final: prev:
let
  inherit (rs) dropped rewritten;

  withoutDropped = spec: removeAttrs spec dropped;

  rewrite =
    name:
    prev.${name}.overrideAttrs (old: {
      passthru = old.passthru // {
        dependencies = withoutDropped old.passthru.dependencies;
        optional-dependencies = builtins.mapAttrs (_: withoutDropped) (old.passthru.optional-dependencies or { });
      };
    });

  replace =
    name: a:
    (if builtins.elem name rewritten then rewrite name else prev.${name}).overrideAttrs (old: {
      inherit (a) version;
      src = final.pkgs.fetchurl {
        # uv installs a wheel only under its exact file name (%2B -> +)
        name = builtins.replaceStrings [ "%2B" ] [ "+" ] (builtins.baseNameOf a.url);
        inherit (a) url sha256;
      };
      postInstall =
        (old.postInstall or "")
        + "\n"
        + rs.lib.policyLib.stripCommand {
          script = "${script}";
          python = final.python.pythonOnBuildForHost.interpreter;
          site = "$out/${final.python.sitePackages}";
        } rs.policy name a.version;
      passthru = old.passthru // {
        rftstackArtifact = a;
      };
    });
in
builtins.listToAttrs (
  map (name: {
    inherit name;
    value = throw "rftstack: ${name} is a CUDA 13 distribution that policy.toml [[cuda12.drop]] removes from the driver-570 flavour, yet something in it still depends on ${name}; add that package's edge to the drop rules or use the cuda13 flavour";
  }) dropped
)
// builtins.listToAttrs (map (name: { inherit name; value = rewrite name; }) rewritten)
// builtins.mapAttrs replace rs.artifacts
