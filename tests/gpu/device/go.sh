#!/usr/bin/env bash
# On the GPU host, in the call after the last bundle part, carrying .gpu-extra alone (see kit.sh; with the jlink
# runtime and py-spy it is 25 MiB, and the working tree about 16 MiB, session W):
#   rm -rf /tmp/repo && mkdir -p /tmp/repo && cp -r . /tmp/repo/ \
#   && cp -r .gpu-extra/. /tmp/ && rm -rf /tmp/repo/.wheelhouse /tmp/repo/.gpu-extra && bash /tmp/go.sh STEP...
# (PY_SPY=/tmp/py-spy before `bash /tmp/go.sh` for the profile steps.)
# Installs the bundle from /tmp/wh/part-*, applies the policy's patches, then starts
# tests/gpu/host_session.sh STEP... detached (its logs in /tmp/gs); returns at once.
set -u
cd /tmp/repo
[ -d /tmp/iproute ] && export PATH=/tmp/iproute:$PATH
if [ -f /tmp/jre17.tar.xz ] && [ ! -x /tmp/jre/jre17/bin/java ]; then mkdir -p /tmp/jre && tar xJf /tmp/jre17.tar.xz -C /tmp/jre; fi
t0=$(date +%s)
python3 /tmp/wh/part-000/install.py --parts /tmp/wh/part-* > /tmp/install.log 2>&1; echo "install rc=$? $(( $(date +%s) - t0 )) s"
tail -15 /tmp/install.log
python3 -m rftstack.stack.patches "$(python3 -c "import sysconfig;print(sysconfig.get_paths()['purelib'])")" > /tmp/patches.log 2>&1
echo "patches rc=$?"; tail -3 /tmp/patches.log
# The bundle carries the rftstack wheel of the tree it was built from, with that tree's patches (applied at
# install). A bundle older than this tree would run the old patches under the new tests: refuse it.
if ! python3 tests/gpu/device/same_tree.py /tmp/repo; then
    echo "not starting $*: rebuild the bundle from this tree (tests/gpu/device/kit.sh) and carry it again"; exit 1
fi
mkdir -p /tmp/gs
export JAVA=/tmp/jre/jre17/bin/java AGENT_CLASSES=/tmp/agent-classes
# detach.py: its own session, and SIGINT/SIGQUIT back at their defaults (a `&` job of this shell ignores both, and
# the session's servers and tests would inherit that: each stop with SIGINT would wait out its grace period)
(python3 tests/gpu/device/detach.py bash tests/gpu/host_session.sh "$@" </dev/null >/tmp/gs.out 2>&1 &)
sleep 5; cat /tmp/gs/steps.txt 2>/dev/null
