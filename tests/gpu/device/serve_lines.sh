#!/usr/bin/env bash
# On the GPU host, after each step of tests/gpu/host_session.sh: serve_lines.sh LOGS STEP T0 [NAME] writes
# LOGS/NAME-serve-lines.txt (NAME: STEP, or STEP-2 for the step's second run with the same LOGS; default STEP), the
# lines of the step's serve logs (*.log under /tmp/pt-STEP and LOGS/bench/work, changed since T0, epoch seconds)
# that name the proxy's builders or recorders or say `All models are ready.`, each with its file. watch.sh brings that
# file back (gs/*.txt); the step's run directories stay on the host (session AL could not show in which order its
# builders and its models became ready for that). PT_ROOT (default /tmp) is where the pytest steps' directories lie.
set -u
logs=$1 step=$2 t0=$3 name=${4:-$2}
find "${PT_ROOT:-/tmp}/pt-$step" "$logs/bench/work" -name '*.log' -newermt "@$t0" -print0 2>/dev/null \
    | xargs -0 -r grep -HE "Experience (builder|recorder)|All models are ready" > "$logs/$name-serve-lines.txt" 2>/dev/null
exit 0
