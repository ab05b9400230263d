# TEST STAND-IN, NOT NIXPKGS. Used only by nix/testing/eval-outputs.sh (via --override-input
# nixpkgs) to evaluate the flake's outputs to .drv paths on a machine that cannot reach nixpkgs.
# Nothing it defines can be built. `lib/` is copied in from nix-community/nixpkgs.lib by that
# script at evaluation time (fetched code, never committed).
{
  description = "TEST STAND-IN, NOT NIXPKGS: evaluation-only doubles of the nixpkgs attributes rftstack uses";
  outputs = _: {
    lib = import ./lib;
    legacyPackages.x86_64-linux = import ./. { system = "x86_64-linux"; };
  };
}
