"""`nix flake check` on a machine without a GPU: the flake's check set (nix/checks.nix, evaluated by
real Nix) holds no derivation that needs a system feature this machine lacks, and the GPU tests stay
reachable as the package's `gpuCheck` (nixpkgs' passthru.gpuCheck convention) with
requiredSystemFeatures = ["cuda"]. nixpkgs itself is not here: `pkgs.runCommand` is a test double
that records the attributes it is given (builds nothing), everything else is the real nix/lib.
"""

from __future__ import annotations

import subprocess

from nix_helpers import nix_env, nix_eval_json

EXPR = """
let
  rs = import ./nix/lib { policyFile = ./python/rftstack/data/policy.toml; lockFile = ./uv.lock; patchesDir = ./patches; };
  lib = {
    concatMapStringsSep = sep: f: xs: builtins.concatStringsSep sep (map f xs);
    hasPrefix = p: s: builtins.substring 0 (builtins.stringLength p) s == p;
  };
  pkgs.runCommand = name: attrs: _script: { inherit name; features = attrs.requiredSystemFeatures or [ ]; };
  set = import ./nix/checks.nix { inherit pkgs lib rs; src = ./.; testEnv = "test-env"; wrappedTestEnv = "wrapped"; };
in
{
  # (a check set without the `checks`/`gpuCheck` split is read as all checks, gpuCheck missing)
  checks = builtins.mapAttrs (_: d: d.features) (set.checks or set);
  gpuCheck = if set ? gpuCheck then set.gpuCheck.features else null;
}
"""


def _features_here(env: dict) -> set[str]:
    r = subprocess.run(["nix", "config", "show", "system-features"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


def test_default_checks_need_no_feature_this_machine_lacks_and_gpu_check_needs_cuda():
    env = nix_env()
    got = nix_eval_json(EXPR, env)
    here = _features_here(env)
    assert "cuda" not in here  # this is the machine without a GPU the check is about
    needing = {name: f for name, f in got["checks"].items() if set(f) - here}
    assert not needing, f"checks that `nix flake check` cannot build here: {needing}"
    assert set(got["checks"]) == {"nix-tests", "invariants", "unit"}
    assert got["gpuCheck"] == ["cuda"]

