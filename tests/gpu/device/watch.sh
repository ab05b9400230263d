#!/usr/bin/env bash
# On the GPU host: wait up to $1 s (default 240) for host_session.sh's "all done", copying its logs and the
# benchmarks' JSON to $OUT every 10 s, so that a call cut short (or the machine lost right after it) still
# brings back what was there (session L lost two runs' results to polling calls that copied only at the end).
# Call it back to back (the machine goes back after 30 s idle); the last lines of each step's log are printed.
end=$(( $(date +%s) + ${1:-240} ))
while :; do
    if [ -n "${OUT:-}" ]; then
        # one archive: $OUT brings back at most 8 files (session M lost a result JSON to that count)
        (cd /tmp && tar czf "$OUT/gs.tgz.part" --ignore-failed-read gs/*.txt gs/*.log gs/*.json gs/results/*.json gs/bench/*.json gs/bench/*.collapsed.gz \
            gs/bench/*.log install.log patches.log 2>/dev/null; mv -f "$OUT/gs.tgz.part" "$OUT/gs.tgz")
    fi
    grep -q "all done" /tmp/gs/steps.txt 2>/dev/null && break
    [ "$(date +%s)" -ge "$end" ] && break
    sleep 10
done
cat /tmp/gs/steps.txt 2>/dev/null
for f in /tmp/gs/*.log; do [ -f "$f" ] && { echo "== $f"; grep -E "loadgen|done|PASS|FAIL|passed|failed" "$f" | tail -6; }; done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
true
