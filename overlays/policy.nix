# Python overlay: policy.toml applied to the installed files of each named distribution:
#   [[relax]] and [[add]]: dist-info METADATA rewritten, RECORD re-hashed, so `pip check` in the env
#     is clean (nix/scripts/dist-info-edit.sh);
#   [[patch]]: the source patches of patches/, applied strictly by python/rftstack/stack/patches.py (the
#     same applier as `rftstack relax`), RECORD re-hashed.
# The edits, patches and their shell arguments come from nix/lib/policy.nix (builtins.fromTOML;
# patch files' sha256 checked at evaluation); both tools refuse files that do not match the
# policy, so a stale entry fails the build.
#
# # Type
#   import ./policy.nix { rs; script :: Path; patchTool :: { tool; policyFile; patchesDir; } } -> (final: prev: AttrSet)
{ rs, script, patchTool }:
final: prev:
let
  python = final.python.pythonOnBuildForHost.interpreter;
  site = "$out/${final.python.sitePackages}";
  commands =
    dist:
    (if rs.edits ? ${dist} then [ (rs.lib.policyLib.editCommand { script = "${script}"; inherit python site; } dist rs.edits.${dist}) ] else [ ])
    ++ (
      if rs.patches ? ${dist} then
        [
          (rs.lib.policyLib.patchCommand {
            tool = "${patchTool.tool}";
            policyFile = "${patchTool.policyFile}";
            patchesDir = "${patchTool.patchesDir}";
            inherit python site;
          } dist)
        ]
      else
        [ ]
    );
in
builtins.listToAttrs (
  map (dist: {
    name = dist;
    value = prev.${dist}.overrideAttrs (old: {
      postInstall = builtins.concatStringsSep "\n" ([ (old.postInstall or "") ] ++ commands dist);
    });
  }) (builtins.attrNames (rs.edits // rs.patches))
)
