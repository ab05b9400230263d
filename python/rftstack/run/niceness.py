"""The niceness of the Python workers a Ray node of rftstack's starts.

Ray's raylet starts every worker, so every actor, at niceness 15 (its ``worker_niceness``, read from
``RAY_worker_niceness``), to keep them from starving Ray's own processes; a process an actor forks
inherits it. In a serve that is Trinity's proxy (the Explorer actor), its engine actor (vLLM's API
server) and vLLM's EngineCore and worker, where bare ``vllm serve`` runs at the niceness of the shell
(0). With the kernel's autogroup off, the serve's processes then get a small share of CPUs that other work
keeps busy; with it on, processes outside a CPU cgroup share the CPUs session by session first, and
`ray start` runs in a session of its own (docs/benchmarks.md section 1, session X). ``--worker-niceness N`` (``$RFTSTACK_WORKER_NICENESS``)
starts the node's workers at N instead; unset, Ray's 15 as upstream. Only 0-19: a value below the
shell's own needs privileges the raylet does not have.
"""

from __future__ import annotations

from rftstack.errors import UserError

RAY_VAR = "RAY_worker_niceness"  # Ray's config, read by the raylet from its environment
DEFAULT_VAR = "RFTSTACK_WORKER_NICENESS"  # the default of --worker-niceness
RAY_DEFAULT = 15  # Ray 2.60's worker_niceness


def _check(value: str, where: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        n = -1
    if not 0 <= n <= 19:
        raise UserError(f"{where}: give the niceness of the node's Ray workers as a whole number from 0 (the shell's, as "
                        f"`vllm serve`) to 19 (unset: Ray's {RAY_DEFAULT})")
    return n


def asked(flag: str | None, environ) -> int | None:
    """The niceness asked for: ``--worker-niceness``, else $RFTSTACK_WORKER_NICENESS, else None (Ray's)."""
    if flag is not None:
        return _check(flag, f"--worker-niceness {flag}")
    value = environ.get(DEFAULT_VAR, "").strip()
    return _check(value, f"{DEFAULT_VAR}={value!r}") if value else None


def head_env(n: int | None) -> dict[str, str]:
    """What a node's `ray start` gets in its environment for niceness ``n`` (None: nothing, Ray's default)."""
    return {} if n is None else {RAY_VAR: str(n)}


def effective(n: int | None) -> int:
    return RAY_DEFAULT if n is None else n


def add_argument(parser, role: str) -> None:
    parser.add_argument("--worker-niceness", default=None, metavar="N",
                        help=f"the niceness of the Ray workers {role} starts, so of every actor and what it forks, 0-19 "
                             f"(default: ${DEFAULT_VAR}, else Ray's {RAY_DEFAULT}; 0: as `vllm serve` run from the shell)")
