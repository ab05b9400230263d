"""The policy's source patches ([[patch]] in policy.toml) against the installed files: each one not
applied is a finding that names what goes wrong without it and the fix, `rftstack relax`.

Read only (relax.plan_patches is a dry run). A patch whose distribution is not installed is not a
finding (pyenv and vllm-api report missing packages); one whose installed file or version does not
fit is a warning that points at the lock.
"""

from __future__ import annotations

from pathlib import Path

from rftstack.stack import patches, policy, relax
from rftstack.errors import UserError
from rftstack.findings import OK, WARN, Finding


def first_sentence(text: str) -> str:
    """The policy's `why`, up to its first full stop, on one line."""
    flat = " ".join(text.split())
    head, dot, _ = flat.partition(". ")
    return head + "." if dot else flat


def plans(pol: policy.Policy, sites: list[Path] | None = None, directory: Path | None = None) -> list[relax.PatchPlan | tuple[str, str]]:
    """Per [[patch]]: its relax plan, or (file, reason) when it does not fit the installed files."""
    import dataclasses

    sites = sites if sites is not None else relax.default_sites()
    out: list[relax.PatchPlan | tuple[str, str]] = []
    for p in pol.patches:
        try:
            out += relax.plan_patches(sites, dataclasses.replace(pol, patches=(p,)), directory or patches.patches_dir())
        except UserError as exc:
            out.append((p.file, str(exc)))
    return out


def check(found: list[relax.PatchPlan | tuple[str, str]], pol: policy.Policy) -> list[Finding]:
    why = {p.file: p.why for p in pol.patches}
    out = []
    for plan in found:
        if isinstance(plan, tuple):
            name, reason = plan
            out.append(Finding(f"patch.{name.removesuffix('.patch')}", WARN, f"{reason}.",
                               "Reinstall the locked versions (`uv sync --locked`), then run `rftstack relax`.", {"patch": name}))
        elif plan.state == relax.PENDING:
            out.append(Finding(
                f"patch.{plan.file.removesuffix('.patch')}", WARN,
                f"The policy patch {plan.file} is not applied to {plan.dist} {plan.version} ({', '.join(plan.files)}); "
                f"without it: {first_sentence(why[plan.file])}",
                "Run `rftstack relax`.", {"patch": plan.file, "dist": plan.dist, "files": plan.files}))
    applied = [p for p in found if not isinstance(p, tuple) and p.state == relax.ALREADY]
    if not out:
        out.append(Finding("patch", OK, f"All {len(applied)} policy patches of the installed packages are applied.", "",
                           {"applied": [p.file for p in applied]}))
    return out
