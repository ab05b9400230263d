# Python overlay: policy.toml's [[relax]] and [[add]] applied to the installed dist-info of each
# named distribution (METADATA rewritten, RECORD re-hashed), so `pip check` in the env is clean.
# The edits and their shell arguments come from nix/lib/policy.nix (builtins.fromTOML); the
# script refuses metadata that does not match the policy, so a stale entry fails the build.
#
# # Type
#   import ./policy.nix { rs; script :: Path; } -> (final: prev: AttrSet)
{ rs, script }:
final: prev:
builtins.mapAttrs (
  dist: edit:
  prev.${dist}.overrideAttrs (old: {
    postInstall =
      (old.postInstall or "")
      + "\n"
      + rs.lib.policyLib.editCommand {
        script = "${script}";
        python = final.python.pythonOnBuildForHost.interpreter;
        site = "$out/${final.python.sitePackages}";
      } dist edit;
  })
) rs.edits
