# `nix run .#serve -- -c qwen3b.yaml`, `.#ray-head`, `.#doctor`: `rftstack <cmd>` from the
# wrapped driver-570 environment, passing arguments through.
#
# # Type
#   import ./apps.nix { pkgs; package :: Derivation; } -> AttrSet
{ pkgs, package }:
let
  app = cmd: {
    type = "app";
    program = "${pkgs.writeShellScript "rftstack-${cmd}" ''exec ${package}/bin/rftstack ${cmd} "$@"''}";
    meta.description = "rftstack ${cmd} (driver-570 flavour)";
  };
in
{
  serve = app "serve";
  ray-head = app "ray-head";
  doctor = app "doctor";
  default = app "doctor";
}
