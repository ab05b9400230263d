# The flake's outputs (flake.nix stays thin). x86_64-linux only: the lock covers that platform.
#
# # Type
#   import ./outputs.nix inputs -> AttrSet
{
  self,
  nixpkgs,
  pyproject-nix,
  uv2nix,
  pyproject-build-systems,
  ...
}:
let
  inherit (nixpkgs) lib;
  system = "x86_64-linux";

  rs = import ./lib {
    policyFile = ../python/rftstack/data/policy.toml;
    lockFile = ../uv.lock;
    patchesDir = ../patches;
  };

  # Build both flavours on a package set that has the cuda overlay applied.
  mkPackages =
    pkgs:
    let
      overlays = import ../overlays { inherit rs; };
      py = import ./python.nix {
        inherit pkgs lib pyproject-nix uv2nix pyproject-build-systems overlays;
        workspaceRoot = ../.;
      };
      cudaPackages = pkgs.${pkgs.rftstackCudaPackagesAttr};
      wrap = import ./wrap.nix { inherit pkgs; };
      programs = [ "rftstack" "trinity" "ray" "vllm" "python" "python3" ];
    in
    {
      inherit py cudaPackages;
      cuda12 = wrap { name = "rftstack-driver570"; env = py.envs.cuda12; inherit cudaPackages programs; };
      # CUDA 13 wheels bring their own toolkit pieces; only the driver is looked up.
      cuda13 = wrap { name = "rftstack-cuda13"; env = py.envs.cuda13; inherit programs; };
      cuda12-test = wrap {
        name = "rftstack-test-driver570";
        env = py.envs.cuda12-test;
        inherit cudaPackages;
        programs = [ "python" "rftstack" ];
      };
    };

  pkgs = import nixpkgs {
    inherit system;
    config = {
      allowUnfree = true; # the CUDA libraries' licence
      cudaSupport = true;
    };
    overlays = [ (import ../overlays/cuda.nix { inherit rs; }) ];
  };
  out = mkPackages pkgs;
  src = lib.cleanSource ../.;
  checkSet = import ./checks.nix {
    inherit pkgs lib rs src;
    testEnv = out.py.envs.cuda12-test;
    wrappedTestEnv = out.cuda12-test;
  };
  # The GPU tests ride on the package as nixpkgs does it (passthru.gpuCheck), not in `checks`.
  withGpuCheck = drv: drv // { gpuCheck = checkSet.gpuCheck; passthru = (drv.passthru or { }) // { inherit (checkSet) gpuCheck; }; };
in
{
  # Pure functions over policy.toml + uv.lock (nix/lib), and the Python overlays for reuse.
  lib = rs // {
    pythonOverlays = removeAttrs (import ../overlays { inherit rs; }) [ "cuda" "default" ];
  };

  overlays = {
    default = lib.composeExtensions (import ../overlays/cuda.nix { inherit rs; }) (
      import ../overlays { inherit rs mkPackages; }
    ).default;
    cuda = import ../overlays/cuda.nix { inherit rs; };
  };

  packages.${system} = {
    default = withGpuCheck out.cuda12;
    driver570 = withGpuCheck out.cuda12;
    cuda13 = out.cuda13;
    env-driver570 = out.py.envs.cuda12;
    env-cuda13 = out.py.envs.cuda13;
  };

  # The pyproject.nix package sets of both flavours, for inspection and overrides.
  legacyPackages.${system}.pythonSets = out.py.sets;

  apps.${system} = import ./apps.nix {
    inherit pkgs;
    package = out.cuda12;
  };

  devShells.${system}.default = import ./devshell.nix {
    inherit pkgs;
    env = out.py.envs.cuda12-dev;
    inherit (out) cudaPackages;
  };

  # Default checks pass without a GPU; the GPU tests: nix build .#default.gpuCheck
  checks.${system} = checkSet.checks;
}
