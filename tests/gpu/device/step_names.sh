# Sourced by tests/gpu/host_session.sh: the names a step's files get when it runs again with the same LOGS (session AM
# ran `ready-3b-late` twice and moved the first run's files aside by hand, or the second would have overwritten them).
#
# run_name LOGS STEP      STEP, or STEP-2, STEP-3, ... when LOGS/STEP.log (LOGS/STEP-2.log, ...) is there already
run_name() {
    local logs=$1 step=$2 name=$2 n=1
    while [ -e "$logs/$name.log" ]; do n=$((n + 1)); name=$step-$n; done
    echo "$name"
}
# label_args SUFFIX ARG...  ARG... in the array LABELLED, SUFFIX after the value of --label (serve_vs_bare.py names
#                           its result file and its work folder after the label)
label_args() {
    local suffix=$1 prev="" a
    shift
    LABELLED=()
    for a in "$@"; do
        [ "$prev" = --label ] && a=$a$suffix
        LABELLED+=("$a")
        prev=$a
    done
}
# rotate_steps LOGS        LOGS/steps.txt of an earlier session that ended ("all done") moves to steps-N.txt, so that
#                          watch.sh, which waits for "all done" in steps.txt, waits for this session's
rotate_steps() {
    local logs=$1 n=1
    grep -q "all done" "$logs/steps.txt" 2>/dev/null || return 0
    while [ -e "$logs/steps-$n.txt" ]; do n=$((n + 1)); done
    mv "$logs/steps.txt" "$logs/steps-$n.txt"
}
