# Python overlay of the `cuda13` flavour (drivers >= 580): the lock's PyPI wheels as they are.
# torch 2.11.0 links the CUDA 13 libraries of the nvidia-* wheels; those are exactly the dists
# policy.toml [[cuda12.drop]] lists, so they become torch's buildInputs for autoPatchelf.
#
# # Type
#   import ./cuda13.nix { rs; } -> (final: prev: AttrSet)
{ rs }:
final: prev: {
  torch = prev.torch.overrideAttrs (old: {
    buildInputs =
      (old.buildInputs or [ ])
      ++ map (n: final.${n}) (builtins.filter (n: n != "cuda-toolkit") rs.dropped);
    autoPatchelfIgnoreMissingDeps = (old.autoPatchelfIgnoreMissingDeps or [ ]) ++ [ "libcuda.so.1" ];
  });
}
