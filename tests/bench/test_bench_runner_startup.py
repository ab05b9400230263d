"""bench/runner_startup.py's pieces: the runner's progress lines it reads (as `rftstack serve` prints
them: the messages are checked against serve's and ray_head's source) and the summary's ratios."""

from __future__ import annotations

from pathlib import Path

import runner_startup as rs

REPO = Path(__file__).resolve().parents[2]

# a real `rftstack serve` run's progress lines (CPU machine, the H200 driver double, fake trinity)
LINES = """\
[   0.0s] run directory /tmp/run
[   0.0s] preflight: rftstack doctor (this machine)
[   1.0s] starting Ray head on 127.0.0.1:53133 (1 GPU(s), temp dir /tmp/rfts-ray-oougc3z0)
[   1.0s] preflight: rftstack doctor (the config)
[  20.3s] Ray head processes up after 19 s; waiting until the cluster answers a driver
[  23.7s] Ray head answers at 127.0.0.1:53133 after 23 s
[  23.8s] effective config /tmp/run/config.yaml (6 change(s)):
[  23.8s] trinity started (pid 29677): python fake_trinity.py run --config /tmp/run/config.yaml; log /tmp/run/logs/trinity.log
[  25.8s] READY after 26 s: OpenAI endpoint http://127.0.0.1:43631/v1 (model 'm')
{"event": "ready", "endpoint": "http://127.0.0.1:43631/v1"}
""".splitlines()


def test_marks_reads_the_runner_progress_lines():
    assert rs.marks(LINES) == {"machine_checks": 0.0, "head_starting": 1.0, "config_checks": 1.0, "head_up": 20.3,
                               "head_answers": 23.7, "config_written": 23.8, "trinity_started": 23.8, "ready": 25.8}  # fmt: skip


def test_every_mark_is_a_message_the_runner_prints():
    """Each pattern's literal start is in serve's or ray_head's source (fails if a message is reworded)."""
    source = "".join((REPO / "python" / "rftstack" / "run" / f).read_text() for f in ("serve.py", "ray_head.py"))
    source = source.replace("Ray {node.role} ", "Ray head ")  # ray_head.launch serves heads and workers
    for key, pattern in rs.MARKS.items():
        literal = pattern.lstrip("^").split("\\")[0].split("(")[0].rstrip()
        assert literal and literal in source, (key, literal)


def test_summary_medians_and_per_round_ratios():
    rounds = [
        {"runner": {"ready_s": 30.0, "marks": {"ready": 29.5}}, "manual": {"ready_s": 20.0}},
        {"runner": {"ready_s": 24.0, "marks": {"ready": 23.5}}, "manual": {"ready_s": 20.0}},
        {"runner": {"ready_s": 22.0, "marks": {"ready": 21.5}}, "manual": {"ready_s": None}},
    ]
    s = rs.summary(rounds, ["runner", "manual"])
    assert s["phases"]["runner"] == {"median_ready_s": 24.0, "n": 3, "all": [30.0, 24.0, 22.0]}
    assert s["phases"]["manual"]["n"] == 2
    assert s["runner_minus"] == {"manual": 7.0}  # median of 10 and 4: pairs only where both got ready
    assert s["runner_ratio"] == {"manual": 1.35}
    assert s["runner_marks_median"] == {"ready": 23.5}


def test_summary_with_a_baseline_runner():
    """runner-baseline (an earlier source tree in the same run): the runner's difference to it and
    the baseline's own phases."""
    rounds = [{"runner": {"ready_s": 7.0, "marks": {"trinity_started": 6.0}},
               "runner-baseline": {"ready_s": 10.0, "marks": {"trinity_started": 8.5}}, "manual": {"ready_s": 5.0}}]  # fmt: skip
    s = rs.summary(rounds, ["runner", "runner-baseline", "manual"])
    assert s["runner_minus"] == {"runner-baseline": -3.0, "manual": 2.0}
    assert s["runner_ratio"] == {"runner-baseline": 0.7, "manual": 1.4}
    assert s["runner_baseline_marks_median"] == {"trinity_started": 8.5}
