# Runner for ./default.nix and the invariants: evaluates to a list of
# { name; ok; message; } (one per test and per invariant), for nix/ci-check.sh to print.
#
# # Example
#   nix-instantiate --eval --strict --json nix/tests/run.nix
let
  tests = import ./default.nix;
  rs = import ../lib {
    policyFile = ../../python/rftstack/data/policy.toml;
    lockFile = ../../uv.lock;
    patchesDir = ../../patches;
  };
  run =
    name: t:
    let
      r = builtins.tryEval (builtins.deepSeq t.expr t.expr);
    in
    {
      name = "tests.${name}";
      ok = r.success && r.value == t.expected;
      message =
        if !r.success then
          "evaluating the expression threw"
        else
          "expected ${builtins.toJSON t.expected} but got ${builtins.toJSON r.value}";
    };
in
builtins.attrValues (builtins.mapAttrs run tests)
++ map (i: i // { name = "invariants.${i.name}"; }) (import ../lib/invariants.nix rs)
