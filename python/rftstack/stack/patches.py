"""Source patches of installed packages, named in policy.toml ([[patch]]), applied identically by
the Nix build and the non-Nix install (`python -m rftstack.stack.patches SITE`, or
`python3 patches.py SITE --policy policy.toml --patches DIR` as a standalone file in a bare Python).

Standard library only (the Nix build runs it in a bare Python). A patch is a unified diff whose
paths are relative to site-packages (``a/torch/...``). Application is strict: every hunk's context
must match the installed file exactly (no fuzz), the patch file's sha256 must match the policy,
and the distribution's version must be the one the policy names. Applying twice is a no-op
("already applied"); a file that matches neither side is refused. The dist-info RECORD line of a
patched file is rewritten with its new hash and size, so the install stays self-consistent.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import os
import re
import sys
import tempfile
from pathlib import Path

if __package__:  # part of the rftstack package
    from rftstack.stack import policy as _policy
else:  # pragma: no cover - a standalone file next to policy.py (like relax.py; the standalone test)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import policy as _policy  # type: ignore

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Hunk:
    old_start: int
    before: list[str]  # context and removed lines
    after: list[str]  # context and added lines


@dataclasses.dataclass(frozen=True)
class FilePatch:
    path: str  # relative to site-packages
    hunks: list[Hunk]

    def reversed(self) -> "FilePatch":
        """This patch turned around: applied to a patched file it gives the file as published."""
        return FilePatch(self.path, [Hunk(h.old_start, h.after, h.before) for h in self.hunks])


def patches_dir() -> Path:
    """patches/ of the repository (a checkout) or its copy inside the installed package."""
    packaged = Path(__file__).parent.parent / "data" / "patches"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "patches"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse(text: str) -> list[FilePatch]:
    files: list[FilePatch] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            target = lines[i + 1][4:].split("\t")[0].strip()
            path = target[2:] if target.startswith("b/") else target
            hunks: list[Hunk] = []
            i += 2
            while i < len(lines) and lines[i].startswith("@@"):
                m = _HUNK.match(lines[i])
                if not m:
                    raise PatchError(f"bad hunk header {lines[i]!r}")
                old_len = int(m.group(2) or 1)
                new_len = int(m.group(4) or 1)
                before, after = [], []
                i += 1
                while i < len(lines) and (len(before) < old_len or len(after) < new_len):
                    line = lines[i]
                    tag, body = (line[:1], line[1:]) if line else (" ", "")
                    if tag == " ":
                        before.append(body)
                        after.append(body)
                    elif tag == "-":
                        before.append(body)
                    elif tag == "+":
                        after.append(body)
                    elif tag == "\\":
                        pass
                    else:
                        raise PatchError(f"bad hunk line {line!r}")
                    i += 1
                hunks.append(Hunk(int(m.group(1)), before, after))
            files.append(FilePatch(path, hunks))
        else:
            i += 1
    if not files:
        raise PatchError("no file patches found")
    return files


def _find(lines: list[str], block: list[str], hint: int) -> int | None:
    """Index of ``block`` in ``lines``: at ``hint`` if it is there, else the unique match."""
    n = len(block)
    if lines[hint : hint + n] == block:
        return hint
    hits = [k for k in range(len(lines) - n + 1) if lines[k : k + n] == block]
    return hits[0] if len(hits) == 1 else None


def apply_text(text: str, fp: FilePatch) -> tuple[str, str]:
    """(new text, "applied" | "already applied"); raises PatchError when the file matches neither side."""
    lines = text.split("\n")
    out = list(lines)
    offset = 0
    applied = already = 0
    for h in fp.hunks:
        hint = max(h.old_start - 1 + offset, 0)
        at = _find(out, h.before, hint)
        done = _find(out, h.after, hint)
        # a hunk that only adds lines after its context (one appending to a file has no context below it)
        # leaves its original lines in place: there the patched lines decide that it is applied already
        if done is not None and (at is None or h.before == h.after or len(h.after) > len(h.before)):
            offset += len(h.after) - len(h.before)
            already += 1
        elif at is not None:
            out[at : at + len(h.before)] = h.after
            offset += len(h.after) - len(h.before)
            applied += 1
        else:
            raise PatchError(f"{fp.path}: hunk at line {h.old_start} matches neither the original nor the patched file")
    if applied and already:
        raise PatchError(f"{fp.path}: partly patched already; reinstall the package and apply again")
    return "\n".join(out), ("applied" if applied else "already applied")


def undo(text: str, patch_file: Path, rel: str) -> str:
    """``text`` (the file ``rel``) without ``patch_file``'s hunks for it: reversed where applied; a text
    without them is returned as it is (the reverse finds the original lines already there)."""
    for fp in parse(patch_file.read_text()):
        if fp.path == rel:
            text = apply_text(text, fp.reversed())[0]
    return text


def record_hash(data: bytes) -> str:
    """A dist-info RECORD hash (``sha256=`` urlsafe base64, no padding); relax uses it too."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a new inode, keeping its mode: uv installs by hard-linking
    from its cache, which must stay untouched. Relax uses it too."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _update_record(site: Path, rel: str, data: bytes) -> bool:
    for record in site.glob("*.dist-info/RECORD"):
        rows = list(csv.reader(io.StringIO(record.read_text())))
        hit = False
        for row in rows:
            if row and row[0] == rel:
                row[1:3] = [record_hash(data), str(len(data))]
                hit = True
        if hit:
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            replace_file(record, buf.getvalue().encode("utf-8"))
            return True
    return False


def installed_version(site: Path, dist: str) -> str | None:
    norm = _policy.canonical(dist)
    for meta in site.glob("*.dist-info/METADATA"):
        name = meta.parent.name[: -len(".dist-info")].rsplit("-", 1)[0]
        if _policy.canonical(name) == norm:
            for line in meta.read_text(errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None


def apply(site: Path, patch_file: Path, *, expect_sha256: str, dist: str, version: str, dry_run: bool = False) -> list[tuple[str, str]]:
    """Apply one policy patch to the site-packages dir ``site``; [(file, "applied" | "already applied")].

    With ``dry_run`` every check runs and nothing is written ("applied" then means "would apply")."""
    got = sha256(patch_file)
    if got != expect_sha256:
        raise PatchError(f"{patch_file} has sha256 {got}, the policy says {expect_sha256}; restore the file or update the policy")
    have = installed_version(site, dist)
    # local version tags (2.11.0+cu128) carry the same Python sources as the plain version
    if have is None or have.split("+")[0] != version.split("+")[0]:
        raise PatchError(f"{patch_file.name} is for {dist} {version}, {site} has {dist} {have}; install the locked version")
    results = []
    plans = []
    for fp in parse(patch_file.read_text()):
        target = site / fp.path
        if not target.is_file():
            raise PatchError(f"{patch_file.name} patches {fp.path}, which is not in {site}")
        new, result = apply_text(target.read_text(), fp)
        plans.append((target, fp, new, result))
    for target, fp, new, result in plans:  # all hunks checked before any file is written
        if result == "applied" and not dry_run:
            replace_file(target, new.encode("utf-8"))
            _update_record(site, fp.path, new.encode())
            for cached in target.parent.glob(f"__pycache__/{target.stem}.*.pyc"):
                cached.unlink()
        results.append((fp.path, result))
    return results


def state(site: Path, policy=None, directory: Path | None = None) -> list[tuple[str, str]]:
    """Without writing: [(patch file, "applied" | "not applied" | "cannot apply: ...")]."""
    pol = policy or _policy.load()
    out = []
    for p in pol.patches:
        try:
            fps = parse(((directory or patches_dir()) / p.file).read_text())
            results = [apply_text((site / fp.path).read_text(), fp)[1] for fp in fps]
            out.append((p.file, "applied" if all(r == "already applied" for r in results) else "not applied"))
        except (OSError, PatchError) as exc:
            out.append((p.file, f"cannot apply: {exc}"))
    return out


def apply_policy(site: Path, policy=None, directory: Path | None = None, dists: list[str] | None = None) -> list[tuple[str, str, str]]:
    """Every [[patch]] of the policy (only those of ``dists`` when given); [(patch file, target file, result)]."""
    pol = policy or _policy.load()
    want = None if dists is None else {_policy.canonical(d) for d in dists}
    out = []
    for p in pol.patches:
        if want is not None and _policy.canonical(p.dist) not in want:
            continue
        for path, result in apply(site, (directory or patches_dir()) / p.file, expect_sha256=p.sha256, dist=p.dist, version=p.version):
            out.append((p.file, path, result))
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="rftstack.stack.patches", description="apply the policy's [[patch]] entries to a site-packages")
    parser.add_argument("site", type=Path, help="the site-packages directory")
    parser.add_argument("--policy", type=Path, default=None, help="policy.toml (default: the package's)")
    parser.add_argument("--patches", type=Path, default=None, help="the patches directory (default: the package's / the repo's)")
    parser.add_argument("--dist", action="append", default=None, help="only the patches of this distribution (repeatable; the Nix build patches one derivation at a time)")
    args = parser.parse_args(argv)
    try:
        pol = _policy.load(args.policy)
        for name, path, result in apply_policy(args.site, pol, args.patches, args.dist):
            print(f"{name}: {path}: {result}")
    except (PatchError, _policy.PolicyError) as exc:
        print(f"rftstack patches: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
