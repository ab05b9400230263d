# Wrap an environment's programs so they run on the host's GPU driver with the CUDA 12.8
# toolkit for the JIT paths, without baking a driver into the closure:
#   LD_LIBRARY_PATH   += the host's driver libraries only (scripts/host-driver.sh: NixOS
#                        /run/opengl-driver/lib; elsewhere libcuda.so.1 via ldconfig -p or known
#                        paths, symlinked into a private dir so the host's libc never leaks in)
#   CUDA_HOME          = the 12.8 toolkit (FlashInfer JIT runs nvcc from it)
#   TRITON_PTXAS_PATH  = its ptxas (Triton's bundled ptxas may be newer than driver 570 accepts)
#
# # Type
#   import ./wrap.nix { pkgs; } { name; env; cudaPackages ? null; programs :: [String]; } -> Derivation
#
# # Example
#   wrap { name = "rftstack"; env = envs.cuda12; cudaPackages = pkgs.cudaPackages_12_8; programs = [ "rftstack" ]; }
{ pkgs }:
{
  name,
  env,
  cudaPackages ? null,
  programs,
}:
let
  toolkitEnv =
    if cudaPackages == null then
      ""
    else
      ''
        export CUDA_HOME=${cudaPackages.cudatoolkit}
        export TRITON_PTXAS_PATH=${cudaPackages.cudatoolkit}/bin/ptxas
      '';
  wrapper = program: ''
    cat > $out/bin/${program} <<'WRAPPER'
    #!${pkgs.runtimeShell}
    source ${./scripts/host-driver.sh}
    if driver_dir=$(rftstack_driver_dir); then
      export LD_LIBRARY_PATH="$driver_dir''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    ${toolkitEnv}
    exec ${env}/bin/${program} "$@"
    WRAPPER
    chmod +x $out/bin/${program}
  '';
in
pkgs.runCommand name
  {
    passthru = { inherit env; };
    meta.mainProgram = "rftstack";
  }
  ''
    mkdir -p $out/bin
    ${builtins.concatStringsSep "\n" (map wrapper programs)}
    # everything else of the env (python, site-packages) stays reachable for tools
    ln -s ${env} $out/env
  ''
