# PEP 508 environment markers, the subset that uv.lock files of this project use:
# clauses `VAR OP 'VALUE'` joined by ` and `. Anything else (or, parentheses, `in`) is refused
# with a sentence instead of being guessed at. Pure: builtins only.
let
  clauseRe = ''^ *([a-z_]+) *(==|!=|>=|<=|<|>) *['"]([^'"]*)['"] *$'';

  versionVars = [
    "python_version"
    "python_full_version"
    "platform_release"
  ];

  splitAnd = marker: builtins.filter builtins.isString (builtins.split " and " marker);

  compare =
    isVersion: op: a: b:
    let
      c = if isVersion then builtins.compareVersions a b else (if a == b then 0 else 2);
    in
    if op == "==" then
      c == 0
    else if op == "!=" then
      c != 0
    else if !isVersion then
      throw "rftstack: marker operator ${op} is not defined for strings (${a} ${op} ${b})"
    else if op == ">=" then
      c >= 0
    else if op == "<=" then
      c <= 0
    else if op == "<" then
      c < 0
    else
      c > 0;

  evalClause =
    environ: clause:
    let
      m = builtins.match clauseRe clause;
      var = builtins.elemAt m 0;
      op = builtins.elemAt m 1;
      value = builtins.elemAt m 2;
    in
    if m == null then
      throw "rftstack: marker clause '${clause}' is outside the subset nix/lib/markers.nix evaluates (VAR OP 'VALUE' joined by ' and ')"
    else if !(environ ? ${var}) then
      throw "rftstack: marker variable '${var}' is not in the environment passed to markers.evaluate"
    else
      compare (builtins.elem var versionVars) op environ.${var} value;
in
{
  # Evaluate a marker string against an environment.
  #
  # # Type
  #   evaluate :: AttrSet -> (String | Null) -> Bool
  #
  # # Arguments
  #   environ: marker variables, e.g. (import ./environ.nix).cpython "3.12.11"
  #   marker:  the `marker` field of a uv.lock dependency, or null (always true)
  #
  # # Example
  #   evaluate { python_full_version = "3.12.11"; } "python_full_version >= '3.12'"  => true
  evaluate =
    environ: marker:
    if marker == null then
      true
    else if builtins.match ".*( or |\\(| in | not in ).*" marker != null then
      throw "rftstack: marker '${marker}' uses 'or', parentheses or 'in', which nix/lib/markers.nix does not evaluate"
    else
      builtins.all (evalClause environ) (splitAnd marker);
}
