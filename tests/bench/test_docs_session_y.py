"""docs/benchmarks.md's session Y claims (2026-12-05, CPU) are what the result files in bench/results/cpu-2026-12-05y/
hold: Trinity's proxy served from a Ray actor against the same proxy in a process of its own, and the first run that
the `uv run` hook spoiled."""

from __future__ import annotations

import json
import re

from helpers import REPO

DOC = REPO / "docs" / "benchmarks.md"
RUNS = REPO / "bench" / "results" / "cpu-2026-12-05y"
HEADING = "### Trinity's proxy in a Ray actor, as the Explorer serves it"
PLAIN, ACTOR = "sqlite-gc+numeric", "sqlite-gc+numeric+actor"


def section() -> str:
    m = re.search(rf"^{re.escape(HEADING)}[^\n]*\n(.*?)(?=^### )", DOC.read_text(), flags=re.S | re.M)
    assert m, f"docs/benchmarks.md has no '{HEADING}' section"
    return " ".join(m.group(1).split())


def load(name: str) -> dict:
    return json.loads((RUNS / name).read_text())


def test_the_actor_table_is_the_result_files():
    text = section()
    for name, first in (("actor-1.json", PLAIN), ("actor-2.json", ACTOR)):
        r = load(name)
        assert list(r["runs"])[1] == first, name
        s = r["summary"]
        row = (f"| {s[PLAIN]['32']['req_s']:.0f} | {s[ACTOR]['32']['req_s']:.0f} | {s[PLAIN]['64']['req_s']:.0f} | "
               f"{s[ACTOR]['64']['req_s']:.0f} | {s[PLAIN]['cpu_ms_per_response']:.3f} / {s[ACTOR]['cpu_ms_per_response']:.3f} |")
        assert f"`{name}`" in text and row in text, row
        runs = r["runs"]
        assert runs[PLAIN]["proxy_hosting"] == "process" and runs[ACTOR]["proxy_hosting"] == "ray-actor"
        for v in (PLAIN, ACTOR):  # the patched proxy in both, every response recorded, at niceness 0
            answered = sum(lv["ok"] for lv in runs[v]["levels"]) + 8 * len(runs[v]["levels"])
            assert runs[v]["recorded_rows"] == answered and runs[v]["proxy_niceness"] == 0
            assert runs[v]["proxy_fast_forward"] and runs[v]["proxy_gc_tuning"] and runs[v]["proxy_numeric_logprobs"]


def test_the_readings_of_the_actor_runs():
    text = section()
    ratio = {c: [load(n)["summary"][ACTOR][c]["req_s"] / load(n)["summary"][PLAIN][c]["req_s"] for n in ("actor-1.json", "actor-2.json")]
             for c in ("32", "64")}
    said = "kept " + " / ".join(f"{x:.2f}" for x in ratio["32"]) + " of the plain process's rate at c=32 and " + \
        " / ".join(f"{x:.2f}" for x in ratio["64"]) + " at c=64"
    assert said in text, said
    cpu = [load(n)["summary"][v]["cpu_ms_per_response"] for n in ("actor-1.json", "actor-2.json") for v in (PLAIN, ACTOR)]
    assert max(cpu[1] / cpu[0], cpu[0] / cpu[1], cpu[3] / cpu[2], cpu[2] / cpu[3]) < 1.07 and "(within 7 %)" in text


def test_the_run_the_uv_run_hook_spoiled():
    s = load("uvrun-hook.json")["summary"]
    rate = s["hop-gc+actor"]["8"]["req_s"] / s["hop-gc"]["8"]["req_s"]
    cpu = s["hop-gc+actor"]["cpu_ms_per_response"] / s["hop-gc"]["cpu_ms_per_response"]
    assert f"from the actor {rate:.2f} of the process's rate, {cpu:.1f} times its CPU a response" in section()
