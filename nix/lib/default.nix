# rftstack's Nix library: pure functions over policy.toml and uv.lock (builtins only, no
# nixpkgs), shared by the overlays, the invariants and the Nix-level tests.
#
# # Type
#   import ./nix/lib { policyFile :: Path; lockFile :: Path; pythonVersion :: String; root :: String; patchesDir :: Path | null }
#     -> AttrSet
#
# # Example
#   (import ./nix/lib { policyFile = ./python/rftstack/data/policy.toml; lockFile = ./uv.lock; })
#     .flavours.cuda12.names
{
  policyFile,
  lockFile,
  # The interpreter the flake builds with (nixpkgs' python312); only major.minor matters here.
  pythonVersion ? "3.12.11",
  root ? "rftstack",
  # The repository's patches/ (policy [[patch]] files); null: no patches are applied (the
  # invariant every-policy-patch-is-applied then fails for a policy that names some).
  patchesDir ? null,
  # What auto-patchelf may resolve (nix/data/libraries.toml).
  librariesFile ? ../data/libraries.toml,
}:
let
  markers = import ./markers.nix;
  environLib = import ./environ.nix;
  lockLib = import ./lock.nix;
  closure = import ./closure.nix;
  policyLib = import ./policy.nix;

  policy = policyLib.read policyFile;
  lock = lockLib.read lockFile;
  environ = environLib.cpython pythonVersion;
  pyMinor = builtins.fromJSON (builtins.elemAt (builtins.splitVersion pythonVersion) 1);

  dropped = policyLib.droppedNames policy;
  # Packages whose dependency lists the driver-570 overlay rewrites.
  rewritten = closure.dependentsOf lock dropped;
  dropEdges = {
    cuda13 = _: _: false;
    cuda12 = from: to: builtins.elem from rewritten && builtins.elem to dropped;
  };
  libraries = builtins.fromTOML (builtins.readFile librariesFile);
  autoPatchelfLib = import ./autopatchelf.nix {
    inherit libraries lock environ closure;
    artifacts = policyLib.artifacts policy;
    cudaLibraries = policyLib.replacementLibraries policy;
  };

  flavour =
    { dropEdge, groups }:
    let
      pkgs = closure.walk {
        inherit lock environ root groups dropEdge;
      };
    in
    {
      packages = pkgs;
      names = closure.names pkgs;
    };
in
rec {
  inherit
    policy
    lock
    environ
    pyMinor
    dropped
    rewritten
    ;
  lib = {
    inherit markers lockLib closure policyLib;
  };

  artifacts = policyLib.artifacts policy;
  edits = policyLib.edits policy;
  patches = if patchesDir == null then { } else policyLib.patches policy patchesDir;
  inherit patchesDir;
  replacementLibraries = policyLib.replacementLibraries policy;
  inherit libraries;

  # Per flavour and package: what auto-patchelf gets (search paths, libraries, ignored names).
  autoPatchelf = builtins.mapAttrs (
    f: cuda:
    autoPatchelfLib.plan {
      flavour = f;
      inherit (flavours.${f}) packages;
      dropEdge = dropEdges.${f};
      inherit cuda;
    }
  ) { cuda12 = true; cuda13 = false; };

  flavours = {
    # The plain PyPI wheels (CUDA 13; drivers >= 580).
    cuda13 = flavour {
      dropEdge = _: _: false;
      groups = [ ];
    };
    # Driver 570: edges to dropped dists are removed only where the overlay removes them.
    cuda12 = flavour {
      dropEdge = dropEdges.cuda12;
      groups = [ ];
    };
    # The dev shell's closure (driver-570 flavour plus the dev group).
    cuda12-dev = flavour {
      dropEdge = dropEdges.cuda12;
      groups = [ "dev" ];
    };
  };
}
