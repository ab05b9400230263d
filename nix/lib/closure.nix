# The set of lock packages a flavour installs: a walk of uv.lock from the project, through
# extras, with edges removed by a `dropEdge` predicate. The driver-570 overlay (overlays/cuda12.nix)
# rewrites the dependency lists of exactly the packages `dependentsOf` names, so a walk that
# drops edges only *from those packages* sees what Nix installs: if `dependentsOf` missed one,
# a CUDA 13 dist would stay reachable and the invariant in invariants.nix would say so.
let
  lockLib = import ./lock.nix;
in
rec {
  # Walk the lock.
  #
  # # Type
  #   walk :: { lock, environ, root :: String, groups :: [String], dropEdge :: (String -> String -> Bool) }
  #        -> [Package]
  #
  # # Arguments
  #   root:     the project's name in the lock (e.g. "rftstack")
  #   groups:   dependency groups of the root to include (e.g. [ "dev" ])
  #   dropEdge: called with the depending package's name and the dependency's name; true
  #             removes the edge
  #   rootPackage: a lock package to start from instead of `root` (for a package whose name
  #             the lock has in several versions)
  #
  # # Example
  #   map (p: p.name) (walk { ...; root = "rftstack"; groups = [ ]; dropEdge = _: _: false; })
  #     => [ "rftstack" "greenlet" ... ]
  walk =
    {
      lock,
      environ,
      root,
      groups ? [ ],
      dropEdge ? (_: _: false),
      rootPackage ? null,
    }:
    let
      idx = lockLib.index lock;
      rootPkg = if rootPackage != null then rootPackage else lockLib.resolve idx { name = root; };
      node = pkg: which: {
        key = "${lockLib.key pkg}${if which ? extra then "[${which.extra}]" else if which ? group then "{${which.group}}" else ""}";
        inherit pkg which;
      };
      nodesOf =
        dep:
        let
          p = lockLib.resolve idx dep;
        in
        [ (node p { }) ] ++ map (e: node p { extra = e; }) (dep.extra or [ ]);
      next =
        n:
        builtins.concatMap nodesOf (
          builtins.filter (d: !dropEdge n.pkg.name d.name) (lockLib.edges environ n.pkg n.which)
        );
      nodes = builtins.genericClosure {
        startSet = [ (node rootPkg { }) ] ++ map (g: node rootPkg { group = g; }) groups;
        operator = next;
      };
      pkgs = builtins.attrValues (
        builtins.listToAttrs (map (n: { name = lockLib.key n.pkg; value = n.pkg; }) nodes)
      );
    in
    pkgs;

  # Names of a package list, sorted.
  #
  # # Type
  #   names :: [Package] -> [String]
  names = pkgs: builtins.sort builtins.lessThan (map (p: p.name) pkgs);

  # Packages that have a (direct or extra) dependency on a dropped name: the ones whose
  # dependency lists the driver-570 overlay rewrites.
  #
  # # Type
  #   dependentsOf :: AttrSet -> [String] -> [String]
  #
  # # Example
  #   dependentsOf lock [ "nvidia-cudnn-cu13" ] => [ "torch" ]
  dependentsOf =
    lock: dropped:
    let
      depNames =
        p:
        map (d: d.name) (
          (p.dependencies or [ ]) ++ builtins.concatLists (builtins.attrValues (p.optional-dependencies or { }))
        );
      hits = builtins.filter (
        p: !(builtins.elem p.name dropped) && builtins.any (n: builtins.elem n dropped) (depNames p)
      ) lock.package;
    in
    builtins.sort builtins.lessThan (map (p: p.name) hits);
}
