# nixpkgs overlay: one CUDA package set for everything, the one policy.toml [cuda12] names.
#
# Why cudaPackages_12_8: driver 570 supports CUDA <= 12.8, so every CUDA library in the closure
# (cudart, cuBLAS, cuDNN, NCCL, ...) and the toolkit the JIT paths use (FlashInfer via CUDA_HOME,
# Triton via TRITON_PTXAS_PATH) must be 12.8 or older; code built by a newer toolkit fails there
# ("PTX was compiled with an unsupported toolchain"). torch's cu128 wheels are built against 12.8,
# and vllm's cu129 wheel runs with the 12.8 cudart that the cu128 torch wheels bring (public
# reports, stack.md). nixpkgs builds cuDNN/NCCL/cuSPARSELt for this set, so no pip CUDA wheel is
# needed, and `cudaPackages` pointing at it keeps any nixpkgs package from mixing in another.
#
# # Type
#   import ./cuda.nix { rs; } -> (final: prev: AttrSet)
{ rs }:
let
  attr = "cudaPackages_" + builtins.replaceStrings [ "." ] [ "_" ] rs.policy.cuda12.cuda;
in
final: prev: {
  cudaPackages = final.${attr};
  rftstackCudaPackagesAttr = attr;
}
