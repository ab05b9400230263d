"""Apply the policy to installed distributions: relaxations, additions, patches.

For each distribution the policy names, rewrites Requires-Dist lines in its dist-info METADATA
(relax: `was` -> `now`; add: a missing requirement) and the METADATA entry of its RECORD (sha256,
size), so `pip check` is clean; then applies the policy's source patches ([[patch]], strictly,
with patches.py: exact context, the patch file's sha256 and the installed version checked; the
RECORD line of each patched file re-hashed). Idempotent. Refuses, before writing anything, when an
installed version, a METADATA line or a patched file is not what the policy was written for.
Files are replaced, never edited in place: uv installs by hard-linking from its cache, which must
stay untouched.

Standard library only: it also runs as a standalone file next to policy.py and patches.py in a
bare Python (`python3 relax.py --site DIR --policy policy.toml --patches DIR`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import sys
import sysconfig
from pathlib import Path

if __package__:  # part of the rftstack package
    from rftstack.stack import patches as _patches
    from rftstack.stack import policy as _policy
    from rftstack.errors import UserError
else:  # pragma: no cover - a standalone file next to policy.py and patches.py (the standalone test)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import patches as _patches  # type: ignore
    import policy as _policy  # type: ignore

    class UserError(Exception):  # type: ignore[no-redef]
        def __init__(self, message: str, exit_code: int = 2):
            super().__init__(message)
            self.exit_code = exit_code


APPLIED, CHANGED, ABSENT = "applied", "changed", "absent"
# states of a [[patch]]: applied by this run, already applied before, would be applied (--check)
PATCHED, ALREADY, PENDING = "applied", "already", "pending"


@dataclasses.dataclass
class Plan:
    """What relax will do to one distribution."""

    dist: str
    version: str | None  # installed version, None when absent
    dist_info: Path | None
    edits: list[str]  # human descriptions of the pending changes
    new_metadata: str | None  # None when nothing changes

    @property
    def state(self) -> str:
        if self.dist_info is None:
            return ABSENT
        return CHANGED if self.new_metadata is not None else APPLIED


def _metadata_fields(text: str) -> tuple[str, str]:
    name = version = ""
    for line in text.splitlines():
        if not line.strip():
            break  # end of headers
        if line.startswith("Name:"):
            name = line[5:].strip()
        elif line.startswith("Version:"):
            version = line[8:].strip()
    return name, version


def find_dist_info(sites: list[Path], dist: str) -> Path | None:
    """The dist-info directory of ``dist`` in ``sites`` (first match), or None."""
    want = _policy.canonical(dist)
    for site in sites:
        if not site.is_dir():
            continue
        for d in sorted(site.glob("*.dist-info")):
            if not _policy.canonical(d.name[: -len(".dist-info")].split("-")[0]) == want:
                continue
            meta = d / "METADATA"
            if meta.is_file() and _policy.canonical(_metadata_fields(meta.read_text(encoding="utf-8"))[0]) == want:
                return d
    return None


def _norm(req: str) -> str:
    return "".join(req.split())


def _requires(lines: list[str]) -> list[tuple[int, str]]:
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            break
        if line.startswith("Requires-Dist:"):
            out.append((i, line[len("Requires-Dist:") :].strip()))
    return out


def plan_dist(sites: list[Path], dist: str, pol: _policy.Policy) -> Plan:
    relaxes, adds = pol.for_dist(dist)
    d = find_dist_info(sites, dist)
    if d is None:
        return Plan(dist, None, None, [], None)
    text = (d / "METADATA").read_text(encoding="utf-8")
    _, version = _metadata_fields(text)
    wanted = {r.version for r in relaxes} | {a.version for a in adds}
    if version not in wanted:
        raise UserError(
            f"{dist} {version} is installed but the policy was written for {dist} {', '.join(sorted(wanted))}; "
            f"install the locked version (`uv sync`) or update {pol.path.name}"
        )
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    edits: list[str] = []
    for r in relaxes:
        reqs = _requires(lines)
        was = [i for i, req in reqs if _norm(req) == _norm(r.was)]
        now = [i for i, req in reqs if _norm(req) == _norm(r.now)]
        if was:
            for i in was:
                lines[i] = f"Requires-Dist: {r.now}{newline}"
            edits.append(f"relax {r.was!r} -> {r.now!r}")
        elif not now:
            declared = [req for _, req in reqs if _policy.requirement_name(req) == _policy.requirement_name(r.was)]
            raise UserError(
                f"{dist} {version} declares {declared or 'no ' + _policy.requirement_name(r.was)} instead of {r.was!r}, "
                f"so the policy's relaxation does not fit it; update {pol.path.name}"
            )
    for a in adds:
        reqs = _requires(lines)
        if any(_norm(req) == _norm(a.requirement) for _, req in reqs):
            continue
        at = reqs[-1][0] + 1 if reqs else next((i for i, l in enumerate(lines) if not l.strip()), len(lines))
        lines.insert(at, f"Requires-Dist: {a.requirement}{newline}")
        edits.append(f"add {a.requirement!r}")
    new = "".join(lines)
    return Plan(dist, version, d, edits, new if new != text else None)


def _split_marker(req: str) -> tuple[str, str]:
    head, sep, marker = req.partition(";")
    return head.strip(), marker.strip() if sep else ""


def plan_rewrites(sites: list[Path], pol: _policy.Policy) -> list[Plan]:
    """The policy's [[cuda12.rewrite]] for each CUDA 12 artifact installed at its version (the pip/uv
    route of the driver-570 flavour); nothing for other versions (the CUDA 13 flavour)."""
    out: list[Plan] = []
    for dist in sorted({_policy.canonical(r.dist) for r in pol.rewrites}):
        d = find_dist_info(sites, dist)
        if d is None:
            continue
        text = (d / "METADATA").read_text(encoding="utf-8")
        _, version = _metadata_fields(text)
        rules = [r for r in pol.rewrites if _policy.canonical(r.dist) == dist and r.version == version]
        if not rules:
            continue
        lines = text.splitlines(keepends=True)
        newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
        edits: list[str] = []
        for r in rules:
            for i, req in reversed(_requires(lines)):
                head, marker = _split_marker(req)
                if _policy.requirement_name(head) != _policy.canonical(r.requirement) or "extra" in marker:
                    continue
                if _norm(head) in {_norm(n) for n in r.now}:
                    continue  # rewritten before
                new = [f"Requires-Dist: {n}{'; ' + marker if marker else ''}{newline}" for n in r.now]
                lines[i : i + 1] = new
                edits.append(f"rewrite {req!r} -> {', '.join(repr(n) for n in r.now) or 'nothing'}")
        new_text = "".join(lines)
        out.append(Plan(dist, version, d, edits, new_text if new_text != text else None))
    return out


@dataclasses.dataclass
class PatchPlan:
    """What relax does with one policy [[patch]]."""

    file: str  # the patch's name under patches/
    dist: str
    version: str | None  # installed version, None when absent
    site: Path | None
    files: list[str]  # the files it patches, relative to site-packages
    state: str  # PATCHED | ALREADY | PENDING | ABSENT


def plan_patches(sites: list[Path], pol: _policy.Policy, directory: Path) -> list[PatchPlan]:
    """Check every policy patch against the installed files (nothing written); refuses on mismatch."""
    out = []
    for p in pol.patches:
        site = next((s for s in sites if s.is_dir() and _patches.installed_version(s, p.dist) is not None), None)
        if site is None:
            out.append(PatchPlan(p.file, p.dist, None, None, [], ABSENT))
            continue
        try:
            results = _patches.apply(site, directory / p.file, expect_sha256=p.sha256, dist=p.dist, version=p.version, dry_run=True)
        except OSError as exc:
            raise UserError(f"cannot read the policy patch {p.file} ({exc.strerror}: {exc.filename}); pass --patches DIR (the repository's patches/)") from None
        except _patches.PatchError as exc:
            raise UserError(f"policy patch {p.file} does not fit {site}: {exc}") from None
        state = PENDING if any(r == "applied" for _, r in results) else ALREADY
        out.append(PatchPlan(p.file, p.dist, _patches.installed_version(site, p.dist), site, [f for f, _ in results], state))
    return out


def apply_patch(plan: PatchPlan, pol: _policy.Policy, directory: Path) -> None:
    if plan.state != PENDING or plan.site is None:
        return
    (p,) = [p for p in pol.patches if p.file == plan.file]
    _patches.apply(plan.site, directory / p.file, expect_sha256=p.sha256, dist=p.dist, version=p.version)
    plan.state = PATCHED


def apply(plan: Plan) -> None:
    if plan.new_metadata is None or plan.dist_info is None:
        return
    meta = plan.dist_info / "METADATA"
    data = plan.new_metadata.encode("utf-8")
    record = plan.dist_info / "RECORD"
    rel = f"{plan.dist_info.name}/METADATA"
    if record.is_file():
        rows = list(csv.reader(io.StringIO(record.read_text(encoding="utf-8"))))
        for row in rows:
            if row and row[0] == rel:
                row[1:3] = [_patches.record_hash(data), str(len(data))]
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        _patches.replace_file(meta, data)
        _patches.replace_file(record, buf.getvalue().encode("utf-8"))
    else:
        _patches.replace_file(meta, data)


def default_sites() -> list[Path]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[k]) for k in ("purelib", "platlib")))


def apply_policy(sites: list[Path], pol: _policy.Policy, *, dry_run: bool = False, patches_dir: Path | None = None) -> tuple[list[Plan], list[PatchPlan]]:
    """Plan every metadata change and every patch first (refusing on any mismatch), then apply."""
    directory = patches_dir or _patches.patches_dir()
    plans = [plan_dist(sites, dist, pol) for dist in sorted(pol.dists())] + plan_rewrites(sites, pol)
    patch_plans = plan_patches(sites, pol, directory)
    if not dry_run:
        for p in plans:
            apply(p)
        for pp in patch_plans:
            apply_patch(pp, pol, directory)
    return plans, patch_plans


def relax(sites: list[Path], pol: _policy.Policy, *, dry_run: bool = False, patches_dir: Path | None = None) -> list[Plan]:
    """apply_policy, returning the metadata plans (the patches are applied too)."""
    return apply_policy(sites, pol, dry_run=dry_run, patches_dir=patches_dir)[0]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--site", action="append", type=Path, help="site-packages directory (default: this interpreter's); repeatable")
    parser.add_argument("--policy", help="policy file (default: the one shipped with rftstack)")
    parser.add_argument("--patches", type=Path, help="directory of the policy's patch files (default: the one shipped with rftstack)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a change or a patch is pending")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    try:
        pol = _policy.load(args.policy)
    except _policy.PolicyError as exc:
        raise UserError(str(exc)) from None
    sites = args.site or default_sites()
    plans, patch_plans = apply_policy(sites, pol, dry_run=args.check, patches_dir=getattr(args, "patches", None))
    pending = [p for p in plans if p.state == CHANGED] + [p for p in patch_plans if p.state == PENDING]
    if args.json:
        print(json.dumps({
            "sites": [str(s) for s in sites],
            "check": args.check,
            "distributions": [
                {"dist": p.dist, "version": p.version, "state": p.state, "edits": p.edits,
                 "dist_info": str(p.dist_info) if p.dist_info else None}
                for p in plans
            ],
            "patches": [
                {"patch": p.file, "dist": p.dist, "version": p.version, "state": p.state, "files": p.files,
                 "site": str(p.site) if p.site else None}
                for p in patch_plans
            ],
        }, indent=2))
    else:
        for p in plans:
            if p.state == ABSENT:
                print(f"{p.dist}: not installed here, nothing to do")
            elif p.state == APPLIED:
                print(f"{p.dist} {p.version}: already as the policy wants")
            else:
                verb = "would change" if args.check else "changed"
                print(f"{p.dist} {p.version}: {verb}: {'; '.join(p.edits)}")
        for p in patch_plans:
            if p.state == ABSENT:
                print(f"patch {p.file}: {p.dist} not installed here, nothing to do")
            elif p.state == ALREADY:
                print(f"patch {p.file}: already applied to {p.dist} {p.version} ({', '.join(p.files)})")
            elif p.state == PENDING:
                print(f"patch {p.file}: would apply to {p.dist} {p.version} ({', '.join(p.files)})")
            else:
                print(f"patch {p.file}: applied to {p.dist} {p.version} ({', '.join(p.files)})")
    return 1 if (args.check and pending) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relax.py", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        print(f"relax: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
