# The dev shell: the driver-570 env with the dev group (pytest) and rftstack editable from the
# checkout, uv (told to use this interpreter and never sync or download), the driver libraries and
# the 12.8 toolkit set as in the wrappers.
#
# # Type
#   import ./devshell.nix { pkgs; env; cudaPackages; } -> Derivation
{ pkgs, env, cudaPackages }:
pkgs.mkShell {
  packages = [
    env
    pkgs.uv
  ];
  env = {
    UV_NO_SYNC = "1";
    UV_PYTHON = "${env}/bin/python";
    UV_PYTHON_DOWNLOADS = "never";
    CUDA_HOME = "${cudaPackages.cudatoolkit}";
    TRITON_PTXAS_PATH = "${cudaPackages.cudatoolkit}/bin/ptxas";
  };
  shellHook = ''
    unset PYTHONPATH
    export REPO_ROOT=$(git rev-parse --show-toplevel)
    source ${./scripts/host-driver.sh}
    if driver_dir=$(rftstack_driver_dir); then
      export LD_LIBRARY_PATH="$driver_dir''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
  '';
}
