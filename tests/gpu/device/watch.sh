#!/usr/bin/env bash
# On the GPU host: wait up to $1 s (default 240) for host_session.sh's "all done", copying its logs and the
# benchmarks' JSON to $OUT every 10 s, so that a call cut short (or the machine lost right after it) still
# brings back what was there (session L lost two runs' results to polling calls that copied only at the end).
# Call it back to back (the machine goes back after 30 s idle); the last lines of each step's log are printed:
# the load generator's levels, serve_profile.py's windows (`resp/s`), interleave.py's levels, the tests' verdicts. GS (default /tmp/gs)
# is host_session.sh's LOGS; the archive keeps its folder name and takes install.log and patches.log beside it.
gs=${GS:-/tmp/gs}
end=$(( $(date +%s) + ${1:-240} ))
while :; do
    if [ -n "${OUT:-}" ]; then
        # one archive: $OUT brings back at most 8 files (session M lost a result JSON to that count)
        (cd "$(dirname "$gs")" && g=$(basename "$gs") && tar czf "$OUT/gs.tgz.part" --ignore-failed-read \
            "$g"/*.txt "$g"/*.log "$g"/*.json "$g"/results/*.json "$g"/bench/*.json "$g"/bench/*.collapsed.gz \
            "$g"/bench/*.log install.log patches.log 2>/dev/null; mv -f "$OUT/gs.tgz.part" "$OUT/gs.tgz")
    fi
    grep -q "all done" "$gs/steps.txt" 2>/dev/null && break
    [ "$(date +%s)" -ge "$end" ] && break
    sleep 10
done
cat "$gs/steps.txt" 2>/dev/null
for f in "$gs"/*.log; do [ -f "$f" ] && { echo "== $f"; grep -E "loadgen|interleave|resp/s|done|PASS|FAIL|passed|failed" "$f" | tail -6; }; done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
true
