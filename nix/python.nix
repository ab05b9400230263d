# The Python package sets and virtual environments of both flavours, from uv.lock via uv2nix:
# loadWorkspace -> mkPyprojectOverlay { sourcePreference = "wheel"; } -> pyproject.nix package
# set (nixpkgs' python312) -> rftstack's overlays -> mkVirtualEnv.
#
# # Type
#   import ./python.nix { pkgs; lib; pyproject-nix; uv2nix; pyproject-build-systems; overlays; }
#     -> { sets :: { cuda12; cuda13; }; envs :: { cuda12; cuda13; cuda12-dev; cuda12-test; }; workspace; }
{
  pkgs,
  lib,
  pyproject-nix,
  uv2nix,
  pyproject-build-systems,
  overlays,
  workspaceRoot,
}:
let
  workspace = uv2nix.lib.workspace.loadWorkspace { inherit workspaceRoot; };
  lockOverlay = workspace.mkPyprojectOverlay { sourcePreference = "wheel"; };
  editableOverlay = workspace.mkEditablePyprojectOverlay { root = "$REPO_ROOT"; };

  base = pkgs.callPackage pyproject-nix.build.packages { python = pkgs.python312; };

  mkSet =
    flavourOverlay:
    base.overrideScope (
      lib.composeManyExtensions [
        pyproject-build-systems.overlays.wheel
        lockOverlay
        overlays.policy
        flavourOverlay
      ]
    );

  sets = {
    cuda12 = mkSet overlays.cuda12;
    cuda13 = mkSet overlays.cuda13;
  };
in
{
  inherit workspace sets;
  envs = {
    cuda12 = sets.cuda12.mkVirtualEnv "rftstack-env-driver570" workspace.deps.default;
    cuda13 = sets.cuda13.mkVirtualEnv "rftstack-env-cuda13" workspace.deps.default;
    # rftstack editable from $REPO_ROOT (the dev shell)
    cuda12-dev = (sets.cuda12.overrideScope editableOverlay).mkVirtualEnv "rftstack-dev-env-driver570" workspace.deps.all;
    # rftstack installed, plus the dev group (the checks run here, in the sandbox)
    cuda12-test = sets.cuda12.mkVirtualEnv "rftstack-test-env-driver570" workspace.deps.all;
  };
}
