"""A poor man's sampling profiler for every Python process of a run (no py-spy needed).

Put this directory first on PYTHONPATH and set RFTSTACK_STACK_SAMPLES=DIR: each Python process
that starts (including multiprocessing/Ray children, which inherit the environment) then appends
its main thread's stack to DIR/<pid>.jsonl every RFTSTACK_STACK_INTERVAL seconds (default 0.5):

    {"t": <epoch s>, "stack": ["file.py:LINE func", ...], "title": "<cmdline>"}   (innermost last)

"title" is written when the process's command line changes (vLLM and Ray retitle their
processes). The sampler is a daemon thread reading sys._current_frames(), so it costs one short
GIL hold per sample. Without RFTSTACK_STACK_SAMPLES this file only chains to the sitecustomize
it shadows (Debian/Ubuntu ship one).
"""

import os
import sys


def _chain_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        path = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.abspath(entry or ".") != here and os.path.isfile(path):
            with open(path) as f:
                code = compile(f.read(), path, "exec")
            exec(code, {"__name__": "_shadowed_sitecustomize", "__file__": path})
            return


def _cmdline() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return " ".join(sys.argv)[:200]


def _start(out_dir: str, interval: float) -> None:
    import json
    import threading
    import time

    main_id = threading.main_thread().ident
    path = os.path.join(out_dir, f"{os.getpid()}.jsonl")

    def frames(frame) -> list:
        stack = []
        while frame is not None and len(stack) < 60:
            code = frame.f_code
            stack.append(f"{code.co_filename}:{frame.f_lineno} {code.co_name}")
            frame = frame.f_back
        return stack[::-1]

    def run() -> None:
        title = None
        while True:
            time.sleep(interval)
            if os.getpid() != pid0:  # a fork child: the thread did not follow; stop quietly
                return
            frame = sys._current_frames().get(main_id)
            record = {"t": round(time.time(), 3), "stack": frames(frame)}
            now_title = _cmdline()
            if now_title != title:
                record["title"] = title = now_title
            try:
                with open(path, "a") as f:
                    f.write(json.dumps(record) + "\n")
            except OSError:
                return

    pid0 = os.getpid()
    os.makedirs(out_dir, exist_ok=True)
    threading.Thread(target=run, name="rftstack-stack-sampler", daemon=True).start()


_chain_shadowed()
if os.environ.get("RFTSTACK_STACK_SAMPLES"):
    _start(os.environ["RFTSTACK_STACK_SAMPLES"], float(os.environ.get("RFTSTACK_STACK_INTERVAL", "0.5")))
