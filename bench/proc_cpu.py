"""CPU time of every process (and of the threads of the busiest ones) over a window, from /proc.

A snapshot reads utime + stime of each /proc/<pid>/stat and of each thread's /proc/<pid>/task/<tid>/stat,
with the process's command line (Ray and vLLM retitle their processes: ``ray::Explorer``,
``VLLM::EngineCore``) and each thread's name. :func:`window` turns two snapshots into: per process its CPU
seconds and cores used (CPU s / wall s), sorted, and per process its busiest threads (a process whose one
thread is near 1.0 core is bound by that thread: an event loop, or the GIL).

    from proc_cpu import snapshot, window
    a = snapshot(); ...; b = snapshot(); window(a, b, wall_s)

The machine as a whole (:func:`machine_snapshot`, :func:`machine_window`): /proc/stat's first line in cores
(busy, idle, iowait, and steal: time the hypervisor ran something else while a vCPU wanted to run, which a
Firecracker guest such as the GPU host can lose) and, where the cgroup v2 file is readable, the cgroup's CPU
throttling (cpu.stat: periods throttled, ms throttled) with its limit (cpu.max).
"""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")
# /proc/stat's cpu line, in order (proc(5)); guest and guest_nice are already counted in user and nice
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def stat_ticks(stat_text: str) -> int:
    """utime + stime of one ``stat`` file's text (fields after the command in parentheses)."""
    fields = stat_text.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def stat_nice(stat_text: str) -> int:
    """The niceness in a ``stat`` file's text (field 19 of proc(5)): Ray's workers run at 15 unless told."""
    return int(stat_text.rsplit(")", 1)[1].split()[16])


def _title(pid: str) -> str:
    try:
        raw = (PROC / pid / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def snapshot(proc: Path = PROC) -> dict[int, dict]:
    """{pid: {"title", "ticks", "nice", "threads": {tid: (name, ticks)}}} of every process readable now."""
    out: dict[int, dict] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ticks, nice = stat_ticks(stat), stat_nice(stat)
            threads = {}
            for task in (entry / "task").iterdir():
                try:
                    threads[int(task.name)] = ((task / "comm").read_text().strip(), stat_ticks((task / "stat").read_text()))
                except (OSError, IndexError, ValueError):
                    continue
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
        out[int(entry.name)] = {"title": _title(entry.name), "ticks": ticks, "nice": nice, "threads": threads}
    return out


def window(before: dict[int, dict], after: dict[int, dict], wall_s: float, *, top: int = 12,
           threads: int = 4, responses: int | None = None) -> list[dict]:
    """The ``top`` processes by CPU between two snapshots (processes in both), each with its niceness, CPU seconds,
    cores (CPU s / ``wall_s``), CPU ms per response when ``responses`` is given, and its ``threads`` busiest
    threads (tid, name, CPU s, cores)."""
    rows = []
    for pid, b in after.items():
        a = before.get(pid)
        if a is None:
            continue
        cpu = (b["ticks"] - a["ticks"]) / TICK
        if cpu <= 0:
            continue
        ths = []
        for tid, (name, ticks) in b["threads"].items():
            prev = a["threads"].get(tid)
            if prev is None:
                continue
            t_cpu = (ticks - prev[1]) / TICK
            if t_cpu > 0:
                ths.append({"tid": tid, "name": name, "cpu_s": round(t_cpu, 2), "cores": round(t_cpu / wall_s, 3)})
        ths.sort(key=lambda t: -t["cpu_s"])
        row = {"pid": pid, "title": b["title"], "nice": b.get("nice"), "cpu_s": round(cpu, 2), "cores": round(cpu / wall_s, 3),
               "threads_busy": len(ths), "top_threads": ths[:threads]}
        if responses:
            row["cpu_ms_per_response"] = round(1000 * cpu / responses, 3)
        rows.append(row)
    rows.sort(key=lambda r: -r["cpu_s"])
    return rows[:top]


def find(snap: dict[int, dict], prefix: str) -> list[int]:
    """The pids whose command line starts with ``prefix`` (e.g. ``ray::Explorer``); a prefix that starts
    with ``*`` matches anywhere in the command line (``*vllm serve``)."""
    if prefix.startswith("*"):
        return sorted(pid for pid, p in snap.items() if prefix[1:] in p["title"])
    return sorted(pid for pid, p in snap.items() if p["title"].startswith(prefix))


def sched_autogroup() -> str | None:
    """The kernel's autogroup switch (/proc/sys/kernel/sched_autogroup_enabled): with 1, processes outside a CPU cgroup
    share the CPUs session by session first, and niceness counts only within a session; None where unreadable."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        return None


def parse_proc_stat(text: str) -> dict[str, int]:
    """The ticks of /proc/stat's aggregate ``cpu`` line, by :data:`STAT_FIELDS` name."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "cpu":
            values = [int(w) for w in words[1:1 + len(STAT_FIELDS)]]
            return dict(zip(STAT_FIELDS, values + [0] * (len(STAT_FIELDS) - len(values))))
    raise ValueError("no aggregate 'cpu' line in /proc/stat's text")


def parse_cpu_stat(text: str) -> dict[str, int]:
    """cgroup v2 ``cpu.stat``: {key: integer} (usage_usec, nr_periods, nr_throttled, throttled_usec, ...)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def machine_snapshot(proc: Path = PROC, cgroup: Path = CGROUP) -> dict:
    """/proc/stat's ticks, the CPU count, and the cgroup's cpu.stat and cpu.max where readable."""
    snap: dict = {"stat": parse_proc_stat((proc / "stat").read_text()), "cpus": os.cpu_count() or 1}
    try:
        snap["cgroup"] = parse_cpu_stat((cgroup / "cpu.stat").read_text())
        snap["cpu_max"] = (cgroup / "cpu.max").read_text().strip()
    except OSError:
        pass  # cgroup v1, or not mounted: no throttling figures
    return snap


def machine_window(before: dict, after: dict, wall_s: float) -> dict:
    """Between two :func:`machine_snapshot` s: cores busy (user+nice+system+irq+softirq), idle, iowait and
    steal, out of ``cpus``; with a cgroup, its periods throttled and ms throttled, and its limit."""
    d = {k: (after["stat"][k] - before["stat"][k]) / TICK / wall_s for k in STAT_FIELDS}
    out = {"cpus": after["cpus"],
           "busy_cores": round(d["user"] + d["nice"] + d["system"] + d["irq"] + d["softirq"], 3),
           "idle_cores": round(d["idle"], 3), "iowait_cores": round(d["iowait"], 3), "steal_cores": round(d["steal"], 3)}
    if "cgroup" in before and "cgroup" in after:
        cb, ca = before["cgroup"], after["cgroup"]
        out["cgroup"] = {"cpu_max": after.get("cpu_max"),
                         "periods": ca.get("nr_periods", 0) - cb.get("nr_periods", 0),
                         "throttled_periods": ca.get("nr_throttled", 0) - cb.get("nr_throttled", 0),
                         "throttled_ms": round((ca.get("throttled_usec", 0) - cb.get("throttled_usec", 0)) / 1000, 1)}
    return out


def machine_line(m: dict) -> str:
    """One phrase for a log line: ``machine: 3.1 of 16 cores busy, steal 0.02, 0 ms throttled``."""
    said = f"machine: {m['busy_cores']} of {m['cpus']} cores busy, steal {m['steal_cores']}"
    if "cgroup" in m:
        said += f", {m['cgroup']['throttled_ms']} ms throttled ({m['cgroup']['cpu_max']})"
    return said
