"""Apply the policy's metadata changes to installed distributions, so `pip check` is clean.

For each distribution the policy names, rewrites Requires-Dist lines in its dist-info METADATA
(relax: `was` -> `now`; add: a missing requirement) and the METADATA entry of its RECORD (sha256,
size). Idempotent. Refuses, before writing anything, when an installed version or a METADATA line
is not what the policy was written for. Files are replaced, never edited in place: uv installs by
hard-linking from its cache, which must stay untouched.

Standard library only: the Nix build and the offline bundle's installer run this file with a bare
Python (`python3 relax.py --site DIR --policy policy.toml`).
"""

from __future__ import annotations

import argparse
import base64
import csv
import dataclasses
import hashlib
import io
import json
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

try:  # run as part of the package, or as a standalone file next to policy.py
    from rftstack import policy as _policy
    from rftstack.errors import UserError
except ImportError:  # pragma: no cover - exercised by the standalone test
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import policy as _policy  # type: ignore

    class UserError(Exception):  # type: ignore[no-redef]
        def __init__(self, message: str, exit_code: int = 2):
            super().__init__(message)
            self.exit_code = exit_code


APPLIED, CHANGED, ABSENT = "applied", "changed", "absent"


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


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a new inode (never through a hard link)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
                row[1:3] = [_record_hash(data), str(len(data))]
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        _replace_file(meta, data)
        _replace_file(record, buf.getvalue().encode("utf-8"))
    else:
        _replace_file(meta, data)


def default_sites() -> list[Path]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[k]) for k in ("purelib", "platlib")))


def relax(sites: list[Path], pol: _policy.Policy, *, dry_run: bool = False) -> list[Plan]:
    """Plan every distribution first (refusing on any mismatch), then apply."""
    plans = [plan_dist(sites, dist, pol) for dist in sorted(pol.dists())]
    if not dry_run:
        for p in plans:
            apply(p)
    return plans


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--site", action="append", type=Path, help="site-packages directory (default: this interpreter's); repeatable")
    parser.add_argument("--policy", help="policy file (default: the one shipped with rftstack)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a change is pending")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    try:
        pol = _policy.load(args.policy)
    except _policy.PolicyError as exc:
        raise UserError(str(exc)) from None
    sites = args.site or default_sites()
    plans = relax(sites, pol, dry_run=args.check)
    pending = [p for p in plans if p.state == CHANGED]
    if args.json:
        print(json.dumps({
            "sites": [str(s) for s in sites],
            "check": args.check,
            "distributions": [
                {"dist": p.dist, "version": p.version, "state": p.state, "edits": p.edits,
                 "dist_info": str(p.dist_info) if p.dist_info else None}
                for p in plans
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
