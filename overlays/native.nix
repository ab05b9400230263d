# Python overlay shared by both flavours: native wheels that link libraries of other wheels
# (libtorch*.so of torch) get them as buildInputs so autoPatchelf resolves them, and the
# driver's libcuda.so.1 is never resolved at build time (it comes from the host at run time).
#
# The list is what the wheels' extension modules are known to link against; the first real
# build prints any library autoPatchelf cannot find (not built here: see docs/nix.md).
final: prev:
let
  linksTorch = [
    "torchvision"
    "torchaudio"
    "vllm"
    "torch-c-dlpack-ext"
    "flashinfer-python"
    "tilelang"
  ];
  ignoreDriver = old: {
    autoPatchelfIgnoreMissingDeps = (old.autoPatchelfIgnoreMissingDeps or [ ]) ++ [ "libcuda.so.1" ];
  };
in
builtins.listToAttrs (
  map (name: {
    inherit name;
    value = prev.${name}.overrideAttrs (
      old: ignoreDriver old // { buildInputs = (old.buildInputs or [ ]) ++ [ final.torch ]; }
    );
  }) (builtins.filter (n: prev ? ${n}) linksTorch)
)
// {
  triton = prev.triton.overrideAttrs ignoreDriver;
  cuda-bindings = prev.cuda-bindings.overrideAttrs ignoreDriver;
}
