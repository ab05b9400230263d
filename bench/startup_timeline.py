#!/usr/bin/env python3
"""Where does `rftstack serve`'s time to ready go? A startup timeline from a serve run's logs.

Usage:
    python bench/startup_timeline.py RUN_DIR [RUN_DIR ...] [--json FILE]

RUN_DIR is a serve run directory: it holds `logs/serve.log` and `logs/trinity.log` (or the two
files directly, as the copies under docs/gpu-logs/ do). Nothing is run; only the logs are read.

Clock sources:
  * serve.log: ISO timestamps with a UTC offset, 1 s resolution; its first line is t = 0.
  * trinity.log: vLLM's/Trinity's `INFO 11-29 22:54:20 [file.py:N]` (month-day, no year, 1 s
    resolution, the writing process's local time), Ray's driver lines `2026-11-29 22:47:20,012`
    and flashinfer's `2026-11-29 22:49:00,074 - INFO -` (ms). The year comes from serve.log. The
    local-time offset is taken from serve.log's "loading N s: <quoted trinity line>" progress
    lines (a quoted line cannot be newer than the serve.log line quoting it); without those, 0.
  * Lines without a timestamp (uvicorn's `INFO:     Application startup complete.`) get the
    last timestamp printed before them by the same process, and are marked "inferred".

Each marker below is looked for (first match); a marker not found is reported as missing,
never estimated. A phase's duration is the gap from its marker to the next marker that is
present, and that gap is charged to one category:

  rftstack   rftstack serve's own steps (preflight doctor, config rewrite, readiness poll)
  ray_head   starting the Ray head until it answers a driver
  startup    a process being started and importing its Python modules: from the moment it is
             asked for (trinity launched, actor created, subprocess spawned) to its first line
  engine     vLLM's own work: model config, weight loading, torch.compile, profiling, KV cache,
             CUDA graphs, its OpenAI server start
  trinity    Trinity's orchestration between those steps (Ray connect, Explorer set-up,
             waiting for models, weight-sync group, rollout coordinator, its proxy start)

Some gaps are not logged by anyone; their "note" says what runs there (read from the sources
of vLLM 0.23.0 / Trinity 0.6.0) and that the attribution is inferred.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Ray's prefix for actor output, possibly followed by vLLM's own prefix for its child processes.
PREFIX = re.compile(r"^\((?P<actor>[A-Za-z_][\w.]*) pid=(?P<pid>\d+)(?:, ip=[^)]*)?\)\s?")
CHILD = re.compile(r"^\((?P<child>EngineCore|Worker|EngineCore_DP\d+|Worker_\w+|APIServer) pid=(?P<pid>\d+)\)\s?")
VLLM_TS = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)? ")
FULL_TS = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[,.](\d{1,6}))?")
SERVE_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?) (.*)$")
QUOTED = re.compile(r"loading (\d+) s: .*?(?:DEBUG|INFO|WARNING|ERROR) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")

CATEGORIES = ("rftstack", "ray_head", "startup", "engine", "trinity")
CATEGORY_LABELS = {
    "rftstack": "rftstack serve's own steps",
    "ray_head": "Ray head start",
    "startup": "process start-up / imports",
    "engine": "vLLM engine work",
    "trinity": "Trinity orchestration",
}


class InputError(Exception):
    pass


@dataclass
class Line:
    t: dt.datetime | None  # timezone-aware; None when the line carries no timestamp
    proc: str  # "serve", "driver", "Explorer", "vLLMRolloutModel", "EngineCore", "Worker", ...
    text: str  # the line without Ray's/vLLM's process prefixes
    inferred: bool = False
    lineno: int = 0


@dataclass
class Marker:
    key: str
    label: str
    source: str  # "serve" or "trinity"
    procs: tuple[str, ...] | None  # process names the line must come from (None: any)
    pattern: str | None  # regex on the text; None: the first line of that process
    category: str | None  # category of the gap from this marker to the next present one
    note: str = ""
    reported: str | None = None  # regex with one group: a duration the line itself reports (s)


MARKERS: list[Marker] = [
    Marker("serve_start", "rftstack serve started (first serve.log line)", "serve", None, None, "rftstack",
           "argument parsing, run directory"),
    Marker("preflight", "preflight (rftstack doctor) started", "serve", None, r"^preflight: ", "rftstack",
           "doctor checks, including a Trinity config check in a subprocess that imports torch/ray/verl"),
    Marker("ray_start", "Ray head starting", "serve", None, r"^starting Ray head", "ray_head"),
    Marker("ray_up", "Ray head processes up", "serve", None, r"^Ray head processes up", "ray_head"),
    Marker("ray_ready", "Ray head answers a driver", "serve", None, r"^Ray head answer(?:s|ed)", "rftstack",
           "effective config written", reported=r"after (\d+(?:\.\d+)?) s"),
    Marker("trinity_launched", "trinity launched", "serve", None, r"^trinity started \(pid", "startup",
           "`trinity run` process start and imports"),
    Marker("config_validated", "Trinity config validated (first config_validator line)", "trinity",
           ("driver",), r"\[config_validator\.py:", "trinity", "config check, ray.init"),
    Marker("ray_connected", "trinity connected to Ray", "trinity", ("driver",), r"Connected to Ray cluster",
           "startup", "Explorer actor: worker process start, imports, __init__"),
    Marker("explorer_first", "Explorer actor's first line", "trinity", ("Explorer",), None, "trinity"),
    Marker("explorer_init", "Explorer initialised", "trinity", ("Explorer",), r"Finished initializing Explorer",
           "trinity", "placement group / allocator"),
    Marker("engine_created", "engine actor created (Creating inference_model)", "trinity", ("Explorer",),
           r"Creating inference_model", "startup", "vLLMRolloutModel actor: worker process start, imports"),
    Marker("engine_first", "engine actor's first line (vLLMRolloutModel)", "trinity", ("vLLMRolloutModel",), None,
           "startup", "inferred: vLLM's model-registry inspection runs in a subprocess (imports torch/vllm) "
           "unless VLLM_CACHE_ROOT/modelinfos already has the answer"),
    Marker("engine_config", "engine config resolved (Resolved architecture)", "trinity", ("vLLMRolloutModel",),
           r"Resolved architecture", "startup", "EngineCore process spawn and imports"),
    Marker("enginecore_first", "EngineCore process's first line", "trinity", ("EngineCore",), None, "startup",
           "Worker process spawn and imports (mp executor; with the uni executor the worker is the EngineCore: "
           "its distributed init and model construction)"),
    Marker("worker_first", "Worker process's first line", "trinity", ("Worker",), None, "engine",
           "distributed init, model construction"),
    Marker("load_start", "model load started", "trinity", ("Worker", "EngineCore"), r"Starting to load model", "engine"),
    Marker("model_loaded", "model loaded (Model loading took)", "trinity", ("Worker", "EngineCore"), r"Model loading took",
           "engine", "Dynamo + Inductor compile", reported=r"and (\d+(?:\.\d+)?) seconds"),
    Marker("compiled", "torch.compile done (torch.compile took)", "trinity", ("Worker", "EngineCore"), r"torch\.compile took",
           "engine", "profiling run, KV cache sizing", reported=r"took (\d+(?:\.\d+)?) s"),
    Marker("kv_cache", "KV cache sized (GPU KV cache size)", "trinity", ("EngineCore", "Worker"),
           r"GPU KV cache size", "engine", "CUDA graph capture"),
    Marker("graphs", "CUDA graphs captured", "trinity", ("Worker",), r"Graph capturing finished", "engine"),
    Marker("engine_init", "engine init done (init engine ... took)", "trinity", ("EngineCore",),
           r"init engine \(profile, create kv cache, warmup model\) took", "engine",
           "unlogged: vLLM's EngineCore builds the scheduler's block pool, one Python object per KV block "
           "(found with bench/silent_gap.py stack samples on the H200: 27-38 s for the tiny model's 21.9 M "
           "blocks, 0.1 s for a 3B model's 141 k), then Trinity calls apply_patches on the Worker (about 2 s) "
           "and starts the engine's API server",
           reported=r"took (\d+(?:\.\d+)?) s"),
    Marker("api_start", "engine's OpenAI server starting (vLLM API patch)", "trinity", ("vLLMRolloutModel",),
           r"Using vLLM API patch|Starting vLLM OpenAI API server", "engine"),
    Marker("api_listening", "engine's OpenAI server listening", "trinity", ("vLLMRolloutModel",),
           r"vLLM API server listening", "engine"),
    Marker("api_up", "engine's OpenAI server up (Application startup complete)", "trinity",
           ("vLLMRolloutModel",), r"Application startup complete", "trinity"),
    Marker("models_ready", "All models are ready", "trinity", ("Explorer",), r"All models are ready", "trinity",
           "weight-sync process group"),
    Marker("sync_group", "weight-sync group ready (vLLM init_process_group finished)", "trinity",
           ("vLLMRolloutModel",), r"init_process_group finished", "startup",
           "RolloutCoordinator actor: worker process start, imports"),
    Marker("coordinator_first", "RolloutCoordinator's first line", "trinity", ("RolloutCoordinator",), None,
           "trinity"),
    Marker("coordinator_ready", "Rollout coordinator is ready", "trinity", ("Explorer",),
           r"Rollout coordinator is ready", "trinity"),
    Marker("explorer_ready", "Explorer is ready", "trinity", ("Explorer",), r"Explorer is ready", "trinity",
           "initial weight sync, proxy app set-up"),
    Marker("proxy_start", "proxy starting (Starting Trinity Service on)", "trinity", ("Explorer",),
           r"Starting Trinity Service on", "trinity"),
    Marker("proxy_listening", "proxy listening (Uvicorn running on)", "trinity", ("Explorer",),
           r"Uvicorn running on", "rftstack", "serve's readiness poll"),
    Marker("ready", "serve READY", "serve", None, r"^READY after", None,
           reported=r"after (\d+(?:\.\d+)?) s"),
]

STOP = re.compile(r"^(SIGTERM|SIGINT|SIGHUP) received")
EXIT = re.compile(r"^exit (\d+): (.*)$")

# Derived spans: (key, label, from marker, to marker, marker whose reported value to compare).
SPANS = [
    ("ray_head", "Ray head: starting -> answers", "ray_start", "ray_ready", "ray_ready"),
    ("engine_init", "vLLM engine init (profile, KV cache, warmup): model loaded -> init engine done",
     "model_loaded", "engine_init", "engine_init"),
    ("engine_total", "engine: actor created -> its OpenAI server up", "engine_created", "api_up", None),
    ("trinity_to_ready", "trinity launched -> serve READY", "trinity_launched", "ready", None),
    ("after_models_ready", "All models are ready -> serve READY", "models_ready", "ready", None),
]


def find_logs(run_dir: Path) -> tuple[Path, Path]:
    for base in (run_dir / "logs", run_dir):
        serve, trinity = base / "serve.log", base / "trinity.log"
        if serve.is_file() and trinity.is_file():
            return serve, trinity
    if not run_dir.is_dir():
        raise InputError(f"{run_dir} is not a directory; give a serve run directory (one with logs/serve.log "
                         "and logs/trinity.log).")
    have = [str(p) for p in (run_dir / "logs" / "serve.log", run_dir / "serve.log",
                             run_dir / "logs" / "trinity.log", run_dir / "trinity.log") if p.is_file()]
    raise InputError(f"{run_dir} is not a serve run directory with a startup to read: it needs both serve.log and "
                     f"trinity.log in {run_dir / 'logs'} or in {run_dir} (found: {', '.join(have) or 'neither'}).")


def parse_serve(path: Path) -> list[Line]:
    out = []
    for i, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = SERVE_TS.match(raw)
        if not m:
            continue
        t = dt.datetime.fromisoformat(m.group(1))
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        out.append(Line(t, "serve", m.group(2).strip(), lineno=i))
    if not out:
        raise InputError(f"{path} has no ISO-timestamped line; it is not a log written by rftstack serve.")
    return out


def local_offset(serve: list[Line]) -> dt.timedelta:
    """trinity.log's clock minus serve.log's, from serve's progress lines quoting trinity lines."""
    gaps = []
    for ln in serve:
        m = QUOTED.search(ln.text)
        if not m:
            continue
        mo, d, hh, mi, ss = (int(x) for x in m.groups()[1:])
        quoted = naive_in_year(ln.t, mo, d, hh, mi, ss)
        gaps.append((quoted - ln.t.replace(tzinfo=None)).total_seconds())
    if not gaps:
        return dt.timedelta(0)
    # quoted <= quoting; with a different local clock every gap carries the offset plus a small lag.
    biggest = max(gaps)
    if biggest <= 60:
        return dt.timedelta(0)
    return dt.timedelta(seconds=round(biggest / 900) * 900)


def naive_in_year(ref: dt.datetime, mo: int, d: int, hh: int, mi: int, ss: int, us: int = 0) -> dt.datetime:
    year = ref.year
    t = dt.datetime(year, mo, d, hh, mi, ss, us)
    if t < ref.replace(tzinfo=None) - dt.timedelta(days=180):  # New Year between serve start and this line
        t = dt.datetime(year + 1, mo, d, hh, mi, ss, us)
    return t


def parse_trinity(path: Path, serve_start: dt.datetime, offset: dt.timedelta) -> list[Line]:
    tz = serve_start.tzinfo
    out: list[Line] = []
    last_by_proc: dict[str, dt.datetime] = {}
    for i, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        text = ANSI.sub("", raw).rstrip()
        proc = "driver"
        m = PREFIX.match(text)
        if m:
            proc = m.group("actor")
            text = text[m.end():]
            c = CHILD.match(text)
            if c:
                proc = c.group("child").split("_")[0]
                text = text[c.end():]
        t = None
        mv = VLLM_TS.match(text)
        mf = FULL_TS.match(text)
        if mv:
            mo, d, hh, mi, ss = (int(x) for x in mv.groups())
            t = naive_in_year(serve_start, mo, d, hh, mi, ss)
        elif mf:
            y, mo, d, hh, mi, ss = (int(x) for x in mf.groups()[:6])
            us = int((mf.group(7) or "0").ljust(6, "0"))
            t = dt.datetime(y, mo, d, hh, mi, ss, us)
        if t is not None:
            t = (t - offset).replace(tzinfo=tz)
            last_by_proc[proc] = t
            out.append(Line(t, proc, text, lineno=i))
        else:
            prev = last_by_proc.get(proc)
            out.append(Line(prev, proc, text, inferred=True, lineno=i))
    return out


def first_match(lines: list[Line], mk: Marker) -> Line | None:
    rx = re.compile(mk.pattern) if mk.pattern else None
    for ln in lines:
        if mk.procs is not None and ln.proc not in mk.procs:
            continue
        if ln.t is None:
            continue
        if rx is None:
            if ln.text.strip():
                return ln
        elif rx.search(ln.text):
            return ln
    return None


def analyse(run_dir: Path) -> dict:
    serve_path, trinity_path = find_logs(run_dir)
    serve = parse_serve(serve_path)
    t0 = serve[0].t
    offset = local_offset(serve)
    trinity = parse_trinity(trinity_path, t0, offset)
    warnings: list[str] = []
    notes: list[str] = []
    if offset:
        warnings.append(f"trinity.log's clock is {offset.total_seconds():+.0f} s from serve.log's; corrected")

    stop_line = next((ln for ln in serve if STOP.match(ln.text)), None)
    exit_line = next((ln for ln in serve if EXIT.match(ln.text)), None)

    phases = []
    for mk in MARKERS:
        ln = first_match(serve if mk.source == "serve" else trinity, mk)
        if mk.key == "serve_start":
            ln = serve[0]
        entry = {
            "key": mk.key, "label": mk.label, "source": mk.source, "present": ln is not None,
            "offset_s": None, "duration_s": None, "category": mk.category, "to": None,
            "inferred_time": False, "line": None, "note": mk.note or None,
        }
        if ln is not None:
            entry["offset_s"] = round((ln.t - t0).total_seconds(), 3)
            entry["inferred_time"] = ln.inferred
            entry["line"] = f"{mk.source}.log:{ln.lineno}: {ln.text[:160]}"
            if mk.reported:
                r = re.search(mk.reported, ln.text)
                entry["reported_s"] = float(r.group(1)) if r else None
        phases.append(entry)

    # A stop before READY ends the timeline: it is a marker of its own.
    ready = phases[-1]
    if stop_line is not None and (not ready["present"] or stop_line.t < t0 + dt.timedelta(
            seconds=ready["offset_s"])):
        phases.append({
            "key": "stopped", "label": f"serve stopped before READY ({stop_line.text.split(':')[0]})",
            "source": "serve", "present": True, "offset_s": round((stop_line.t - t0).total_seconds(), 3),
            "duration_s": None, "category": None, "to": None, "inferred_time": False,
            "line": f"serve.log:{stop_line.lineno}: {stop_line.text[:160]}", "note": None,
        })

    # The timeline is the markers in the order upstream logs them. A marker logged before one that comes
    # ahead of it in that order belongs to a process started beside the others (rftstack serve's Ray head
    # answering while Trinity starts, the rollout coordinator created while the models start): it keeps its
    # offset, is marked "parallel", and takes no gap, so every gap of the timeline is >= 0.
    present, latest = [], None
    for p in phases:
        if not p["present"]:
            continue
        if latest is not None and p["offset_s"] < latest["offset_s"]:
            p["parallel"] = True
            notes.append(f"{p['key']} ({p['offset_s']} s) is logged before {latest['key']} ({latest['offset_s']} s): "
                         "it ran beside the timeline (no gap charged to it)")
            continue
        present.append(p)
        latest = p
    for a, b in itertools.pairwise(present):
        a["duration_s"] = round(b["offset_s"] - a["offset_s"], 3)
        a["to"] = b["key"]

    groups = {c: 0.0 for c in CATEGORIES}
    for p in present:
        if p["duration_s"] is not None and p["category"]:
            groups[p["category"]] = round(groups[p["category"]] + p["duration_s"], 3)
    startup_gaps = [
        {"from": p["key"], "to": p["to"], "seconds": p["duration_s"], "what": p["note"]}
        for p in present if p["category"] == "startup" and p["duration_s"] is not None
    ]

    by_key = {p["key"]: p for p in phases}
    spans = []
    for key, label, a, b, rep in SPANS:
        pa, pb = by_key[a], by_key[b]
        s = {"key": key, "label": label, "from": a, "to": b, "seconds": None}
        if pa["present"] and pb["present"]:
            s["seconds"] = round(pb["offset_s"] - pa["offset_s"], 3)
        if rep:
            s["reported_s"] = by_key[rep].get("reported_s")
        spans.append(s)

    ready_after = ready.get("reported_s") if ready["present"] else None
    end = ready["offset_s"] if ready["present"] else (present[-1]["offset_s"] if present else 0.0)
    return {
        "run_dir": str(run_dir),
        "serve_log": str(serve_path),
        "trinity_log": str(trinity_path),
        "serve_start": t0.isoformat(),
        "trinity_clock_offset_s": offset.total_seconds(),
        "ready": ready["present"],
        "ready_offset_s": ready["offset_s"],
        "ready_after_s_reported": ready_after,
        "end_offset_s": end,
        "stopped": stop_line.text if stop_line is not None and not ready["present"] else None,
        "exit": exit_line.text if exit_line is not None else None,
        "missing": [p["key"] for p in phases if not p["present"]],
        "phases": phases,
        "groups_s": groups,
        "startup_gaps": startup_gaps,
        "spans": spans,
        "warnings": warnings,
        "parallel": notes,
        "resolution_note": "serve.log and vLLM/Trinity lines have 1 s resolution: each offset is +-1 s",
    }


def fmt(x: float | None, width: int = 7) -> str:
    return f"{x:{width}.1f}" if x is not None else " " * (width - 1) + "-"


def render(res: dict) -> str:
    out = [f"== {res['run_dir']}  (t=0: {res['serve_start']})"]
    if res["ready"]:
        out.append(f"READY at {res['ready_offset_s']:.0f} s (serve says 'READY after "
                   f"{res['ready_after_s_reported']:g} s')")
    else:
        out.append(f"not READY: {res['stopped'] or res['exit'] or 'the log ends before READY'}")
    out.append(f"{'start s':>7} {'dur s':>7}  {'category':<9} phase")
    for p in res["phases"]:
        if not p["present"]:
            out.append(f"{'missing':>7} {'':>7}  {'':<9} {p['label']}")
            continue
        mark = "~" if p["inferred_time"] else " "
        if p.get("parallel"):
            out.append(f"{fmt(p['offset_s'])}{mark}{'parallel':>7}  {'':<9} {p['label']}")
            continue
        out.append(f"{fmt(p['offset_s'])}{mark}{fmt(p['duration_s'])}  {(p['category'] or '-'):<9} {p['label']}"
                   + (f"  [reports {p['reported_s']:g} s]" if p.get("reported_s") is not None else ""))
    total = sum(res["groups_s"].values())
    out.append(f"grouped (sum of the gaps, {total:.0f} s up to the last marker):")
    for c in CATEGORIES:
        v = res["groups_s"][c]
        share = f"{100 * v / total:4.0f} %" if total else ""
        out.append(f"  {CATEGORY_LABELS[c]:<28} {v:6.1f} s {share}")
    out.append("  start-up / import gaps:")
    for g in res["startup_gaps"]:
        out.append(f"    {g['seconds']:5.1f} s  {g['from']} -> {g['to']}: {g['what'] or ''}"[:150])
    out.append("spans:")
    for s in res["spans"]:
        rep = f" (the log line says {s['reported_s']:g} s)" if s.get("reported_s") is not None else ""
        out.append(f"  {fmt(s['seconds'], 6)} s  {s['label']}{rep}")
    if res["missing"]:
        out.append(f"missing markers: {', '.join(res['missing'])}")
    for n in res.get("parallel", []):
        out.append(f"parallel: {n}")
    for w in res["warnings"]:
        out.append(f"warning: {w}")
    out.append("(~ = time inferred from the same process's previous timestamped line; offsets +-1 s)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", type=Path, help="serve run directories")
    ap.add_argument("--json", type=Path, help="write the timelines as JSON to this file")
    args = ap.parse_args(argv)
    results = []
    for d in args.run_dirs:
        try:
            results.append(analyse(d))
        except InputError as e:
            print(f"startup_timeline: {e}", file=sys.stderr)
            return 2
    print("\n\n".join(render(r) for r in results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
