# TEST STAND-IN, NOT NIXPKGS (see flake.nix). `import nixpkgs { ... }` for evaluation only:
# every attribute rftstack's flake, pyproject.nix and uv2nix touch, as derivations whose builder
# refuses to run. What is modelled faithfully: platforms (lib.systems.elaborate), callPackage /
# makeScope (nixpkgs.lib), fixed-output fetchurl (refuses a missing hash), mkDerivation with
# finalAttrs / overrideAttrs / passthru. Everything else is a named placeholder.
{
  system ? "x86_64-linux",
  config ? { },
  overlays ? [ ],
  ...
}:
let
  lib = import ./lib;
  platform = lib.systems.elaborate system;

  # Values builtins.derivation cannot take (functions, plain sets) become strings.
  drvValue =
    v:
    if builtins.isFunction v then
      "<function>"
    else if builtins.isAttrs v && !(v ? outPath) then
      builtins.toJSON (lib.mapAttrs (_: drvValue) v)
    else if builtins.isList v then
      map drvValue v
    else
      v;

  refuse = name: "echo 'test stand-in, not nixpkgs: ${name} cannot be built' >&2; exit 1";

  mkDerivationFrom =
    f:
    let
      attrs = lib.fix f;
      name = attrs.name or "${attrs.pname}-${attrs.version}";
      passthru = attrs.passthru or { };
      drvAttrs =
        removeAttrs attrs [ "passthru" "meta" "env" ]
        // (attrs.env or { })
        // {
          inherit name system;
          builder = "/bin/sh";
          args = [ "-c" (refuse name) ];
        };
      drv = derivation (lib.mapAttrs (_: drvValue) drvAttrs);
    in
    drv
    // passthru
    // {
      inherit passthru name;
      meta = attrs.meta or { };
      pname = attrs.pname or name;
      version = attrs.version or "";
      overrideAttrs =
        g:
        mkDerivationFrom (
          final:
          let
            prev = f final;
          in
          prev // (lib.toExtension g) final prev
        );
    };

  mkDerivation = a: mkDerivationFrom (if builtins.isFunction a then a else _: a);

  placeholder =
    name: extra:
    mkDerivation ({ inherit name; } // extra);

  stdenv = {
    inherit mkDerivation;
    hostPlatform = platform;
    buildPlatform = platform;
    targetPlatform = platform;
    isLinux = platform.isLinux;
    isDarwin = platform.isDarwin;
    cc = placeholder "gcc-wrapper-stand-in" { } // {
      libc = placeholder "glibc-stand-in" { } // {
        pname = "glibc";
        version = "2.40";
        linuxHeaders = { version = "6.12"; };
      };
    };
    shell = "/bin/sh";
  };

  pkgs = lib.fix (
    lib.foldl' (acc: ov: lib.extends ov acc) (
      self:
      let
        callPackage = lib.callPackageWith self;
      in
      {
        inherit lib config stdenv callPackage system;
        pkgs = self;
        newScope = extra: lib.callPackageWith (self // extra);
        buildPackages = self;
        pkgsBuildHost = self;
        runtimeShell = "/bin/sh";

        fetchurl =
          {
            url ? null,
            urls ? [ url ],
            hash ? null,
            sha256 ? null,
            name ? baseNameOf (builtins.head urls),
            ...
          }:
          if hash == null && sha256 == null then
            throw "test stand-in fetchurl: ${name} has no hash"
          else
            derivation {
              inherit name system urls;
              builder = "/bin/sh";
              args = [ "-c" (refuse name) ];
              outputHashMode = "flat";
              outputHashAlgo = if hash != null then null else "sha256";
              outputHash = if hash != null then hash else sha256;
            }
            // {
              passthru.url = builtins.head urls;
            };

        makeSetupHook =
          { name, substitutions ? { }, propagatedBuildInputs ? [ ], ... }:
          script:
          mkDerivation {
            inherit name propagatedBuildInputs;
            script = "${script}";
            substitutions = builtins.toJSON (lib.mapAttrs (_: v: if builtins.isList v then map toString v else toString v) substitutions);
          };
        replaceVars =
          src: replacements:
          mkDerivation {
            name = baseNameOf (toString src);
            src = "${src}";
            replacements = builtins.toJSON (lib.mapAttrs (_: toString) replacements);
          };
        runCommand = name: env: cmd: mkDerivation (env // { inherit name; buildCommand = cmd; });
        runCommandLocal = self.runCommand;
        writeShellScript = name: text: mkDerivation { inherit name text; };
        writeShellScriptBin = name: text: mkDerivation { inherit name text; meta.mainProgram = name; };
        writeText = name: text: mkDerivation { inherit name text; };
        symlinkJoin = { name, paths, ... }: mkDerivation { inherit name paths; };
        mkShell = { packages ? [ ], env ? { }, shellHook ? "", ... }: mkDerivation ({ name = "nix-shell"; inherit packages shellHook; } // env);

        python3Packages = lib.genAttrs [
          "setuptools-scm" "cython" "libcst" "meson-python" "oldest-supported-numpy" "pdm-backend"
          "poetry-dynamic-versioning" "pydantic-core"
        ] (n: placeholder "python3.12-${n}-stand-in" { } // { setupHook = placeholder "${n}-setup-hook-stand-in" { }; });
        rustPlatform.cargoSetupHook = placeholder "cargo-setup-hook-stand-in" { };
        autoPatchelfHook = placeholder "auto-patchelf-hook-stand-in" { };
        unzip = placeholder "unzip-stand-in" { };
        ugrep = placeholder "ugrep-stand-in" { meta.mainProgram = "ugrep"; };
        uv = placeholder "uv-stand-in" { meta.mainProgram = "uv"; };
        bash = placeholder "bash-stand-in" { };
      }
      // lib.genAttrs [ "cargo" "cmake" "pkg-config" "rustc" "openssl" "libffi" "zlib" "blas" "lapack" "maturin" "c-ares" ] (
        n: placeholder "${n}-stand-in" { }
      )
      // {
        pythonManylinuxPackages = {
          manylinux1 = [ (placeholder "manylinux1-libs-stand-in" { }) ];
          manylinux2010 = [ (placeholder "manylinux2010-libs-stand-in" { }) ];
          manylinux2014 = [ (placeholder "manylinux2014-libs-stand-in" { }) ];
        };

        python312 =
          let
            drv = placeholder "python3-3.12.11-stand-in" { };
            py = drv // rec {
              pname = "python3";
              version = "3.12.11";
              pythonVersion = "3.12";
              sitePackages = "lib/python3.12/site-packages";
              executable = "python3.12";
              interpreter = "${drv}/bin/python3.12";
              implementation = "cpython";
              sourceVersion = { major = "3"; minor = "12"; patch = "11"; suffix = ""; };
              inherit stdenv;
              pythonOnBuildForHost = py;
              isPy3 = true;
              pythonOlder = v: builtins.compareVersions pythonVersion v < 0;
              pythonAtLeast = v: builtins.compareVersions pythonVersion v >= 0;
              passthru = {
                inherit implementation pythonVersion sourceVersion sitePackages executable interpreter;
                pythonOnBuildForHost = py;
              };
            };
          in
          py;

        # cudaPackages_12_8: the attributes rftstack uses, as placeholders.
        cudaPackages_12_8 = lib.genAttrs [
          "cuda_cccl" "cuda_cudart" "cuda_cupti" "cuda_nvcc" "cuda_nvrtc" "cuda_nvtx" "cudnn"
          "libcublas" "libcufft" "libcufile" "libcurand" "libcusolver" "libcusparse"
          "libcusparse_lt" "libnvjitlink" "libnvshmem" "nccl" "cudatoolkit"
        ] (n: placeholder "${n}-12.8-stand-in" { }) // { cudaMajorMinorVersion = "12.8"; };
      }
    ) overlays
  );
in
pkgs
