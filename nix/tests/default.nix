# Nix-level tests of nix/lib (nix-unit style: an attrset of { expr; expected; }), runnable with
# plain `nix-instantiate --eval` through ./run.nix. No nixpkgs: pure functions over builtins,
# the project's policy.toml and uv.lock, and the hand-written fixtures under ./fixtures.
let
  real = import ../lib {
    policyFile = ../../python/rftstack/data/policy.toml;
    lockFile = ../../uv.lock;
    patchesDir = ../../patches;
  };
  broken = import ../lib {
    policyFile = ./fixtures/broken/policy.toml;
    lockFile = ./fixtures/broken/uv.lock;
    root = "app";
  };
  inherit (real.lib) markers lockLib policyLib closure;
  env312 = (import ../lib/environ.nix).cpython "3.12.11";
  env311 = (import ../lib/environ.nix).cpython "3.11.9";
  failing = rs: map (i: i.name) (builtins.filter (i: !i.ok) (import ../lib/invariants.nix rs));
  elemOf = xs: x: builtins.elem x xs;
  script = { script = "edit.sh"; python = "py"; site = "$out/site"; };
in
{
  # --- markers -----------------------------------------------------------------------------
  testMarkerNull = { expr = markers.evaluate env312 null; expected = true; };
  testMarkerVersionGe = {
    expr = map (markers.evaluate env312) [ "python_full_version >= '3.12'" "python_full_version < '3.12'" ];
    expected = [ true false ];
  };
  testMarkerOn311 = { expr = markers.evaluate env311 "python_full_version < '3.12'"; expected = true; };
  testMarkerAnd = {
    expr = markers.evaluate env312 "platform_machine == 'x86_64' and implementation_name != 'PyPy'";
    expected = true;
  };
  testMarkerPyPy = { expr = markers.evaluate env312 "implementation_name == 'pypy'"; expected = false; };
  testMarkerRefusesOr = {
    expr = (builtins.tryEval (markers.evaluate env312 "sys_platform == 'linux' or sys_platform == 'win32'")).success;
    expected = false;
  };

  # --- wheels --------------------------------------------------------------------------------
  testWheelFits = {
    expr = map (lockLib.wheelFits 12) [
      "https://x/torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
      "https://x/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl"
      "https://x/vllm-0.23.0-cp38-abi3-manylinux_2_28_x86_64.whl"
      "https://x/absl_py-2.5.1-py3-none-any.whl"
      "https://x/foo-1-cp312-cp312-manylinux_2_28_aarch64.whl"
      "https://x/foo-1-cp313-abi3-manylinux_2_28_x86_64.whl"
      "https://x/numpy-2.3.5-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
    ];
    expected = [ true false true true false false true ];
  };
  testArtifactOfLockedTorch = {
    expr = builtins.baseNameOf (lockLib.artifact 12 (lockLib.resolve (lockLib.index real.lock) { name = "torch"; })).url;
    expected = "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl";
  };
  testArtifactFallsBackToSdist = {
    expr = (lockLib.artifact 12 (lockLib.resolve (lockLib.index broken.lock) { name = "verl"; })).kind;
    expected = "sdist";
  };

  # --- policy --------------------------------------------------------------------------------
  testCanonical = { expr = map policyLib.canonical [ "Trinity_RFT" "ruamel.yaml" "a--b" ]; expected = [ "trinity-rft" "ruamel-yaml" "a-b" ]; };
  testEditsFromPolicy = {
    expr = real.edits;
    expected = {
      verl = { version = "0.8.0"; replace = [ { was = "numpy<2.0.0"; now = "numpy<2.4,>=2"; } ]; add = [ ]; };
      trinity-rft = { version = "0.6.0"; replace = [ ]; add = [ "greenlet>=3" ]; };
    };
  };
  testEditCommand = {
    expr = policyLib.editCommand script "verl" real.edits.verl;
    expected = "bash edit.sh 'py' \"$out/site\" 'verl' '0.8.0' --replace 'numpy<2.0.0' 'numpy<2.4,>=2'";
  };
  testPatchesFromPolicy = {
    expr = real.patches;
    expected = {
      ray = { version = "2.60.0"; files = [ "ray-prestart-workers.patch" ]; };
      torch = { version = "2.11.0"; files = [ "torch-tcpstore-loopback.patch" ]; };
      trinity-rft = {
        version = "0.6.0";
        files = [ "trinity-proxy-store-errors.patch" "trinity-proxy-stream-record.patch" "trinity-synchronizer-unparsable-sleep.patch"
          "trinity-explorer-node.patch" "trinity-proxy-feedback-errors.patch" "trinity-recorder-group-commit.patch" "trinity-proxy-reload-wait.patch"
          "trinity-proxy-commit-marks.patch" "trinity-proxy-request-hygiene.patch" "trinity-proxy-fast-forward.patch"
          "trinity-sql-read-requeue.patch" "trinity-proxy-api-key.patch" "trinity-proxy-gc.patch"
          "trinity-launcher-head-env.patch" "trinity-engine-uni-executor.patch" "trinity-coordinator-early.patch"
          "trinity-proxy-numeric-logprobs.patch" "trinity-proxy-build-processes.patch" "trinity-proxy-builders-early.patch"
          "trinity-engine-log-stats.patch" "trinity-engine-anyio-root.patch" ];
      };
      uvicorn = { version = "0.54.0"; files = [ "uvicorn-httptools-ignore-upgrade.patch" ]; };
      verl = { version = "0.8.0"; files = [ "verl-unpad-without-flash-attn.patch" ]; };
      vllm = { version = "0.23.0"; files = [ "vllm-logprobs-numeric.patch" "vllm-fork-workers.patch" ]; };
    };
  };
  testPatchCommand = {
    expr = policyLib.patchCommand { tool = "/t"; python = "py"; site = "$out/site"; policyFile = "/p.toml"; patchesDir = "/pd"; } "torch";
    expected = "'py' '/t/patches.py' \"$out/site\" --policy '/p.toml' --patches '/pd' --dist 'torch'";
  };
  testPatchWithWrongHashRefusedAtEvaluation = {
    expr = (builtins.tryEval (builtins.deepSeq (policyLib.patches {
      patch = [ { dist = "torch"; version = "2.11.0"; file = "torch-tcpstore-loopback.patch"; sha256 = "0000000000000000000000000000000000000000000000000000000000000000"; } ];
    } ../../patches) true)).success;
    expected = false;
  };
  testPatchOfTwoVersionsRefused = {
    expr = (builtins.tryEval (builtins.deepSeq (policyLib.patches {
      patch = map (v: { dist = "torch"; version = v; file = "torch-tcpstore-loopback.patch"; sha256 = (builtins.head real.policy.patch).sha256; }) [ "2.11.0" "2.10.0" ];
    } ../../patches) true)).success;
    expected = false;
  };
  testNoPatchesDirMeansPatchInvariantFails = {
    expr = elemOf (failing (import ../lib {
      policyFile = ../../python/rftstack/data/policy.toml;
      lockFile = ../../uv.lock;
    })) "every-policy-patch-is-applied";
    expected = true;
  };
  # The policy overlay on a test double of a pyproject.nix package set (attrsets whose
  # overrideAttrs applies the override to { }): which dists it touches and what postInstall runs.
  testPolicyOverlayAppliesEditsAndPatches =
    let
      pkg = { overrideAttrs = f: f { }; };
      out = (import ../../overlays { rs = real; }).policy
        { python = { pythonOnBuildForHost.interpreter = "py"; sitePackages = "lib/site"; }; }
        { torch = pkg; verl = pkg; trinity-rft = pkg; };
      has = needle: s: builtins.match ".*${needle}.*" (builtins.replaceStrings [ "\n" ] [ " " ] s) != null;
    in
    {
      expr = {
        dists = builtins.attrNames out;
        torchPatched = has "patches.py' \"[$]out/lib/site\" --policy '[^']*policy.toml' --patches '[^']*rftstack-patches' --dist 'torch'" out.torch.postInstall;
        torchNotEdited = !(has "dist-info-edit" out.torch.postInstall);
        verlEdited = has "dist-info-edit.sh 'py' \"[$]out/lib/site\" 'verl' '0.8.0' --replace 'numpy<2.0.0'" out.verl.postInstall;
        verlPatched = has "patches.py' \"[$]out/lib/site\" --policy '[^']*policy.toml' --patches '[^']*rftstack-patches' --dist 'verl'" out.verl.postInstall;
      };
      expected = { dists = [ "ray" "torch" "trinity-rft" "uvicorn" "verl" "vllm" ]; torchPatched = true; torchNotEdited = true; verlEdited = true; verlPatched = true; };
    };
  testQuoting = { expr = policyLib.q "it's"; expected = "'it'\\''s'"; };
  testGlobToEre = { expr = policyLib.globToEre "nvidia-*-cu12"; expected = "nvidia-[A-Za-z0-9._-]*-cu12"; };
  testStripCommand = {
    expr = policyLib.stripCommand script real.policy "torch" "2.11.0+cu128";
    expected = "bash edit.sh 'py' \"$out/site\" 'torch' '2.11.0+cu128' --strip 'nvidia-[A-Za-z0-9._-]*-cu12' --strip 'cuda-toolkit'";
  };
  testArtifactNames = {
    expr = builtins.attrNames real.artifacts;
    expected = [ "torch" "torchaudio" "torchvision" "vllm" ];
  };
  testArtifactTorchUrl = {
    expr = real.artifacts.torch.url;
    expected = "https://download.pytorch.org/whl/cu128/torch-2.11.0%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl";
  };
  testReplacementLibrariesIncludeCore = {
    expr = builtins.all (elemOf real.replacementLibraries) [ "cuda_cudart" "libcublas" "cudnn" "nccl" ];
    expected = true;
  };
  testDuplicateVersionRefused = {
    expr = (builtins.tryEval (builtins.deepSeq (policyLib.edits {
      relax = [ { dist = "verl"; version = "0.8.0"; was = "a"; now = "b"; } ];
      add = [ { dist = "verl"; version = "0.7.1"; requirement = "c"; } ];
    }) true)).success;
    expected = false;
  };

  # --- closure decisions on the real lock ------------------------------------------------------
  testRewrittenPackages = {
    expr = real.rewritten;
    expected = [ "cuda-tile" "humming-kernels" "nvidia-cutlass-dsl" "torch" ];
  };
  testDriver570KeepsNvml = {
    expr = map (elemOf real.flavours.cuda12.names) [ "nvidia-ml-py" "nvidia-cudnn-frontend" "cuda-bindings" "torch" "vllm" "verl" "greenlet" ];
    expected = [ true true true true true true true ];
  };
  testDriver570DropsCuda13 = {
    expr = builtins.filter (elemOf real.flavours.cuda12.names) real.dropped;
    expected = [ ];
  };
  testCuda13FlavourKeepsCuda13 = {
    expr = builtins.filter (n: !(elemOf real.flavours.cuda13.names n)) real.dropped;
    expected = [ ];
  };
  testFlavoursDifferOnlyByDrops = {
    expr = builtins.filter (n: !(elemOf real.flavours.cuda12.names n)) real.flavours.cuda13.names;
    expected = builtins.sort builtins.lessThan real.dropped;
  };
  testOneNetworkxForPython312 = {
    expr = map (p: p.version) (builtins.filter (p: p.name == "networkx") real.flavours.cuda12.packages);
    # uv.lock: networkx 3.6.1 for Python < 3.12, 3.7 for >= 3.12.
    expected = [ "3.7" ];
  };
  testDevGroupAddsPytest = {
    expr = map (elemOf real.flavours.cuda12-dev.names) [ "pytest" "pytest-timeout" ] ++ [ (elemOf real.flavours.cuda12.names "pytest") ];
    expected = [ true true false ];
  };
  testDependentsOf = {
    expr = closure.dependentsOf broken.lock [ "nvidia-nccl-cu13" ];
    expected = [ "torch" ];
  };

  # --- invariants: all hold on the real data, and each one fails on the broken fixture ---------
  testInvariantsHoldOnRealData = { expr = failing real; expected = [ ]; };
  testNetworkxOn311 = {
    expr = map (p: p.version) (builtins.filter (p: p.name == "networkx") (closure.walk {
      lock = real.lock; environ = env311; root = "rftstack";
    }));
    expected = [ "3.6.1" ];
  };
  testInvariantsFailOnBrokenFixture = {
    expr = failing broken;
    expected = [
      "no-cuda13-dist-in-driver570-closure"
      "drop-list-covers-cuda13-metadata"
      "drop-list-names-lock-dists"
      "every-drop-has-replacement-or-reason"
      "cuda12-artifacts-replace-locked-versions"
      "cuda12-artifacts-have-sha256-and-https"
      "policy-edits-target-installed-dists"
      "every-policy-patch-is-applied"
      "every-fetched-file-has-a-hash-cuda12"
      "every-fetched-file-has-a-hash-cuda13"
      "every-closure-package-has-an-installable-file"
    ];
  };

  # --- auto-patchelf plan ------------------------------------------------------------------------
  testAutoPatchelfVllmFindsLibtorchBothFlavours = {
    expr = map (f: builtins.elem { dist = "torch"; dir = "torch/lib"; } real.autoPatchelf.${f}.vllm.searchPaths) [ "cuda12" "cuda13" ];
    expected = [ true true ];
  };
  testAutoPatchelfCudartOnlyInCuda13 = {
    expr = map (f: builtins.elem { dist = "nvidia-cuda-runtime"; dir = "nvidia/cu13/lib"; } real.autoPatchelf.${f}.torch.searchPaths) [ "cuda12" "cuda13" ];
    expected = [ false true ];
  };
  testAutoPatchelfUndeclaredLink = {
    expr = builtins.elem { dist = "torch"; dir = "torch/lib"; } real.autoPatchelf.cuda13.torchaudio.searchPaths;
    expected = true;
  };
  testAutoPatchelfCudaLibsOnlyForArtifacts = {
    expr = map (p: p.cuda != [ ]) [ real.autoPatchelf.cuda12.torch real.autoPatchelf.cuda12.numpy real.autoPatchelf.cuda13.torch ];
    expected = [ true false false ];
  };
  testAutoPatchelfIgnoresDriverAndFlavourIgnores = {
    expr = map (p: builtins.elem "libcute_dsl_runtime.so" p.ignoreMissing && builtins.elem "libcuda.so.1" p.ignoreMissing) [
      real.autoPatchelf.cuda12.tokenspeed-mla
      real.autoPatchelf.cuda13.tokenspeed-mla
    ];
    expected = [ true false ];
  };
}
