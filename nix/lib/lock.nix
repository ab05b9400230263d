# Reading uv.lock (version 1) with builtins only: packages by name, dependency edges under a
# marker environment, and which file (wheel or sdist) a package is installed from.
let
  markers = import ./markers.nix;

  parseWheel =
    url:
    let
      file = builtins.baseNameOf url;
      m = builtins.match "([^-]+)-([^-]+)(-[0-9][^-]*)?-([^-]+)-([^-]+)-([^-]+)\\.whl" file;
    in
    if m == null then
      throw "rftstack: '${file}' is not a wheel file name"
    else
      {
        inherit file;
        python = builtins.filter builtins.isString (builtins.split "\\." (builtins.elemAt m 3));
        abi = builtins.elemAt m 4;
        platforms = builtins.filter builtins.isString (builtins.split "\\." (builtins.elemAt m 5));
      };
in
rec {
  # Parse a uv.lock file.
  #
  # # Type
  #   read :: Path -> AttrSet
  read = path: builtins.fromTOML (builtins.readFile path);

  # The key a package has in the lock: "name==version" (a name can appear in several versions
  # split by markers, e.g. networkx for Python < 3.12 and >= 3.12).
  #
  # # Type
  #   key :: { name, version, ... } -> String
  key = p: "${p.name}==${p.version}";

  # Index the lock's packages by key and by name.
  #
  # # Type
  #   index :: AttrSet -> { byKey :: AttrSet; byName :: AttrSet (name -> [package]) }
  index = lock: {
    byKey = builtins.listToAttrs (map (p: { name = key p; value = p; }) lock.package);
    byName = builtins.groupBy (p: p.name) lock.package;
  };

  # The package a dependency entry points to (its `version` disambiguates).
  #
  # # Type
  #   resolve :: Index -> { name, version?, ... } -> AttrSet
  resolve =
    idx: dep:
    let
      candidates = idx.byName.${dep.name} or (throw "rftstack: uv.lock has no package '${dep.name}'");
      matching = if dep ? version then builtins.filter (p: p.version == dep.version) candidates else candidates;
    in
    if builtins.length matching == 1 then
      builtins.head matching
    else
      throw "rftstack: uv.lock entry '${dep.name}' is ambiguous (${toString (builtins.length matching)} candidates)";

  # The dependency entries of a package (or of one of its extras / dependency groups) whose
  # marker holds in `environ`.
  #
  # # Type
  #   edges :: AttrSet -> Package -> { extra?: String, group?: String } -> [Dep]
  #
  # # Example
  #   edges env torchPkg { }            => [ { name = "filelock"; } ... ]
  #   edges env trinityPkg { extra = "vllm"; } => [ { name = "vllm"; } ]
  edges =
    environ: pkg: which:
    let
      list =
        if which ? extra then
          pkg.optional-dependencies.${which.extra} or [ ]
        else if which ? group then
          pkg.dev-dependencies.${which.group} or [ ]
        else
          pkg.dependencies or [ ];
    in
    builtins.filter (d: markers.evaluate environ (d.marker or null)) list;

  # Whether a wheel file name installs on CPython `pyMinor` (e.g. 12) on x86-64 glibc Linux.
  #
  # # Type
  #   wheelFits :: Int -> String -> Bool
  #
  # # Example
  #   wheelFits 12 "https://x/torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl" => true
  #   wheelFits 12 "https://x/torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl" => false
  wheelFits =
    pyMinor: url:
    let
      w = parseWheel url;
      cp = "cp3${toString pyMinor}";
      abi3From =
        tag:
        let
          m = builtins.match "cp3([0-9]+)" tag;
        in
        m != null && builtins.fromJSON (builtins.head m) <= pyMinor;
      pyOk = builtins.any (t: t == "py3" || t == cp || (w.abi == "abi3" && abi3From t)) w.python;
      abiOk = builtins.elem w.abi [ "none" "abi3" cp ];
      platOk = builtins.any (
        p: p == "any" || (builtins.match "(manylinux.*|linux)_x86_64" p != null)
      ) w.platforms;
    in
    pyOk && abiOk && platOk;

  # The file a package is installed from when wheels are preferred (uv2nix's
  # sourcePreference = "wheel"): the first fitting wheel, else the sdist, else its local source.
  #
  # # Type
  #   artifact :: Int -> Package -> { kind :: "wheel" | "sdist" | "local"; url; hash :: String | Null }
  artifact =
    pyMinor: pkg:
    let
      fitting = builtins.filter (w: wheelFits pyMinor w.url) (pkg.wheels or [ ]);
      src = pkg.source;
    in
    if src ? editable || src ? virtual || src ? directory || src ? path then
      { kind = "local"; url = null; hash = null; }
    else if fitting != [ ] then
      { kind = "wheel"; inherit (builtins.head fitting) url; hash = (builtins.head fitting).hash or null; }
    else if pkg ? sdist then
      { kind = "sdist"; url = pkg.sdist.url or null; hash = pkg.sdist.hash or null; }
    else
      { kind = "none"; url = null; hash = null; };
}
