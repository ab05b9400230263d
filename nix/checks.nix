# The flake's checks:
#   nix-tests, invariants  evaluation-time: nix/tests and nix/lib/invariants.nix; a failure
#                          stops evaluation with its sentence (no build needed)
#   unit                   pytest of tests/ without the gpu and slow markers, in the dev env
# and, outside `checks` so that `nix flake check` passes on machines without a GPU (nixpkgs keeps
# GPU tests in `passthru.gpuCheck` the same way):
#   gpuCheck               pytest -m gpu tests/gpu in the wrapped env; requiredSystemFeatures =
#                          [ "cuda" ] so it only runs on a builder that exposes the GPU (docs/nix.md);
#                          the flake exposes it as packages.*.default.gpuCheck (`nix build .#default.gpuCheck`)
#
# # Type
#   import ./checks.nix { pkgs; lib; rs; testEnv; wrappedTestEnv; src; } -> { checks :: AttrSet; gpuCheck :: Derivation; }
{
  pkgs,
  lib,
  rs,
  testEnv,
  wrappedTestEnv,
  src,
}:
let
  results = import ./tests/run.nix;
  failed = builtins.filter (r: !r.ok) results;
  sentence = lib.concatMapStringsSep "; " (r: "${r.name}: ${r.message}") failed;
  passIf =
    name: rs':
    let
      bad = builtins.filter (r: !r.ok) rs';
    in
    if bad == [ ] then
      pkgs.runCommand name { } ''
        echo "${toString (builtins.length rs')} passed, 0 failed" > $out
      ''
    else
      throw "rftstack: ${lib.concatMapStringsSep "; " (r: "${r.name}: ${r.message}") bad}";
in
assert failed == [ ] || throw "rftstack: ${sentence}";
{
  checks = {
    nix-tests = passIf "rftstack-nix-tests" (builtins.filter (r: lib.hasPrefix "tests." r.name) results);
    invariants = passIf "rftstack-invariants" (import ./lib/invariants.nix rs);

    unit = pkgs.runCommand "rftstack-unit-tests" { nativeBuildInputs = [ testEnv ]; } ''
      cp -r ${src} source && chmod -R u+w source && cd source
      export HOME=$TMPDIR
      python -m pytest -q -p no:cacheprovider -m "not gpu and not slow" tests
      touch $out
    '';
  };

  gpuCheck =
    pkgs.runCommand "rftstack-gpu-tests"
      {
        requiredSystemFeatures = [ "cuda" ];
        nativeBuildInputs = [ wrappedTestEnv ];
      }
      ''
        cp -r ${src} source && chmod -R u+w source && cd source
        export HOME=$TMPDIR
        ${wrappedTestEnv}/bin/python -m pytest -q -p no:cacheprovider -m gpu tests/gpu
        touch $out
      '';
}
