#!/usr/bin/env bash
# One GPU-host session: every GPU test and benchmark, in order, each step's output in $LOGS/<step>.log
# and one line per step in $LOGS/steps.txt; a failing step does not stop the next one.
#
#   setsid bash tests/gpu/host_session.sh [STEP...] </dev/null >/tmp/gs.out 2>&1 &
#
# A step named twice, or run again by a later host_session.sh with the same LOGS, writes STEP-2.log (STEP-2-runs.tgz,
# STEP-2-serve-lines.txt) and its serve_vs_bare label gets -2 (its result JSON and work folder with it); an ended
# session's steps.txt moves to steps-N.txt first (tests/gpu/device/step_names.sh). Other fixed output names (the
# proxy_overhead steps' JSON) are overwritten.
# Started detached so that it outlives one call of a time-limited remote shell; later calls only
# collect $LOGS. Never stop it with `pkill -f host_session.sh` from a remote shell whose own command
# line holds that text: the pattern matches the shell too. Steps (default: all, in this order):
#   rl         tests/gpu/test_rl_loop_gpu.py        the user story through rftstack serve
#   rl-uni     the same with RFTSTACK_ENGINE_EXECUTOR=uni (vLLM's uni executor, the default until session N):
#              rl runs the mp executor whose EngineCore forks its worker (the defaults), this one uni, each
#              test printing the processes on the GPU
#   rl-mp      the same with the mp executor and RFTSTACK_VLLM_FORK_WORKERS=0 (the worker spawned, as upstream)
#   rl-mp-fork the same with both variables spelled out as the defaults (mp, RFTSTACK_VLLM_FORK_WORKERS=1):
#              the step that measured the defaults before they were switched (session N)
#   rl-record  the same with RFTSTACK_PROXY_RECORD_PROCESSES=auto (the experiences recorded by 4 processes beside
#              the proxy, patches/trinity-proxy-build-processes.patch)
#   train      tests/gpu/test_train_loop_gpu.py     serve + rftstack train (verl) on one GPU: 2 steps, 2 reloads
#   train-record  the same with RFTSTACK_PROXY_RECORD_PROCESSES=auto: the trainer's data recorded by those processes
#   train-lora the same with LoRA rank 16 (both configs' model.lora_configs; vLLM's runtime LoRA)
#   train-3b-lora, train-3b  the same on the Qwen2.5-3B shape, LoRA 16 / full: the trainer's peak GPU memory
#              (train_loop-qwen3b-lora16.json, train_loop-qwen3b.json) for docs/train.md's 48 GB table
#   rel        tests/gpu/test_reliability_gpu.py    busy GPU, SIGTERM in load, soak, worker SIGKILL
#   kill       only the worker-SIGKILL test of that file (its own serve, about 4 minutes)
#   faults     tests/gpu/test_faults_gpu.py         kill -9 of the Ray head's GCS and of `trinity run` under load,
#              the proxy's store on a full disk (a tmpfs: needs root); three serves, about 8 minutes
#   tiny       bench/serve_vs_bare.py, tiny model: bare vLLM vs rftstack serve
#   qwen3b     the same on the Qwen2.5-3B-shaped model
#   qwen3b-nogroup  the same with RFTSTACK_RECORDER_GROUP_COMMIT=0 (upstream's recorder write path), for
#              the group-commit patch's effect on the GPU side by side with `qwen3b`
#   proxy3b    the 3B shape: bare, trinity (group commit) and trinity-nogroup in one run, 8 rounds per
#              level, plus c=32,64 with output lengths spread over 16..112 tokens
#   proxy3b-ff the 3B shape: bare, trinity (fast forward + group commit, the defaults) and trinity-noff
#              (RFTSTACK_PROXY_FAST_FORWARD=0) in one run, c=32,64, 8 rounds per level, equal and spread
#              lengths: the figures of docs/benchmarks.md's Summary (bench/summary_table.py)
#   proxy3b-freeze  the 3B shape: bare, trinity (every proxy patch on, the defaults) and trinity-nogc
#              (RFTSTACK_PROXY_GC=0) in one run, c=32,64, 8 rounds per level, equal and spread lengths
#   proxy3b-exec  the 3B shape: bare, trinity (the defaults: the mp executor, its worker forked), trinity-uni
#              (RFTSTACK_ENGINE_EXECUTOR=uni, the default until session N) and trinity-mp (the worker spawned, as
#              upstream) in one run, c=32,64, 8 rounds per level, equal and spread lengths: throughput and time to
#              ready of the executors side by side (run it second on a machine, after a 3B step, for warm caches)
#   proxy3b-numeric  the 3B shape: bare, trinity (numeric logprobs, the default), trinity-nonumeric
#              (RFTSTACK_PROXY_NUMERIC_LOGPROBS=0: upstream's logprobs objects) and trinity-mp (numeric, mp executor)
#              in one run, c=32,64, 8 rounds per level, equal and spread lengths: the numeric-logprobs patches' effect
#   proxy3b-mp  the 3B shape: bare and trinity-mp (numeric logprobs and the mp executor) only, as proxy3b-numeric
#   proxy3b-long  bare, trinity (today's defaults) and trinity-uni with levels four times longer (--rounds 32: 1024
#              and 2048 requests, 10-20 s each), for reading the 0.95 goal through the run-to-run noise of 3-5 s levels
#              (session L); with ready-3b-exec, the Summary's two runs (bench/summary_table.py)
#   proxy3b-build  bare, trinity-build (RFTSTACK_PROXY_BUILD_PROCESSES=auto: 4 experience builder processes on the
#              host's 16 CPUs, the default since session AH) and trinity-nobuild (0: the experiences built on the proxy's
#              loop; session AH ran `trinity`, the default then), long levels as in proxy3b-long; then trinity-build
#              and bare again in the other order (labels qwen3b-build1, qwen3b-build2)
#   proxy3b-warmup  bare, trinity (the defaults: builders on) and trinity-nobuild, long levels as in proxy3b-long, each
#              after an unmeasured level of 512 requests at c=32 (serve_vs_bare --warmup-level 32:512): whether the
#              builders' higher p99 at c=32 (session AH, the first level after ready) is their first answers
#              (orders: WARMUP_ORDERS, default 1:bare,trinity,trinity-nobuild; labels qwen3b-warmup1, ...)
#   proxy3b-record  the same with trinity-record (RFTSTACK_PROXY_RECORD_PROCESSES=auto: 4 recording processes that build,
#              serialize and commit the experiences) in place of trinity-build (labels qwen3b-record1, qwen3b-record2)
#   proxy3b-long-fork  the same with trinity-mp-fork (the mp executor whose EngineCore forks its worker,
#              RFTSTACK_VLLM_FORK_WORKERS=1) in place of trinity-mp: the configuration a switched default would serve
#   proxy3b-c32  where the c=32 gap on today's defaults lies (session P: 0.84, the median answer 56 ms later than
#              bare's): bare and trinity with long levels at c=32,64 *with* the like-proxy runs (bare given the proxy's
#              fields; Trinity's engine straight, engine_direct), then bare alone with --distributed-executor-backend mp:
#              proxy vs its engine is the hop and commit, bare-mp vs bare is the executor's own cost; then the proxy
#              alone on this host's CPU before a test double that answers after 0.27 s (bare's c=32 latency), so its
#              answers come in bursts as vLLM's do: what recording adds to the hop (on the CPU machine: 35-55 ms)
#   proxy3b-spread-direct  bare and trinity as in proxy3b-abba's first order, and after the proxy's loads the proxy's
#              request sent straight to Trinity's engine at the spread levels (serve_vs_bare --engine-direct-spread):
#              whether the loss with spread lengths at c=64 (the builders' long runs without a warm-up level on
#              H100s, sessions AH and AL: 0.76-0.79 of bare) lies in the engine or in the proxy (qwen3b-spread-direct)
#   proxy3b-abba  bare and trinity (today's defaults) as in proxy3b-long, twice, the second time in the other order
#              (bare, trinity; trinity, bare: labels qwen3b-abba1, qwen3b-abba2): two samples of each Summary figure
#              from one machine, and how far one run's ratio moves from the next (sessions P and Q read 0.84 / 0.92
#              and 0.92 / 0.85 at c=32 / c=64, bare's c=64 level 10384 against 12048 tok/s)
#              ABBA_ORDERS="3:bare,trinity" (N:PHASES words, label qwen3b-abbaN) runs other orders, e.g. a third
#   profile3b  bench/serve_profile.py on the 3B shape: rftstack serve, closed loops of 32 and 64 clients through the
#              proxy and straight to its engine, /proc CPU of every process and thread per window, py-spy on the
#              Explorer actor (PY_SPY, default py-spy on PATH), then bare vLLM's windows
#   frontend3b  bench/serve_profile.py on the 3B shape without py-spy: rftstack serve (proxy and engine direct), then
#              bare vLLM five times (default; --api-server-count 2; --distributed-executor-backend mp; vLLM's Rust
#              frontend, VLLM_USE_RUST_FRONTEND=1; that with mp), each window plain and with the proxy's fields, with
#              the engine's own account from /metrics (steps/s, tokens per step, running requests): which frontend or
#              executor gives the fields' cost back?
#   frontend3b-numeric  the same, with --numeric (one more window per level: the proxy's fields with numeric
#              logprobs, straight to Trinity's engine and to bare), 12 s windows, bare as default, with mp, and with
#              mp and --api-server-count 2 (where the fields' remaining cost lies: the proxy, the engine or vLLM's frontend)
#   frontend3b-numeric-api2  its last bare variant only (mp and --api-server-count 2), no serve
#   frontend3b-logprobs-mode  bare only: default, and with --logprobs-mode processed_logprobs (what Trinity's engine
#              sets, for the sampling distribution's logprobs) on uni and on mp: whether that mode is the engine's
#              remaining cost against bare with the same fields (session N: 0.87 on one machine)
#   frontend3b-numeric-mpfork  its serve part only, with the mp executor and forked workers spelled out
#              (RFTSTACK_ENGINE_EXECUTOR=mp RFTSTACK_VLLM_FORK_WORKERS=1, the defaults since session N): proxy
#              against engine direct there
#   engine3b   bench/serve_profile.py on the 3B shape, 12 s windows with numeric logprobs: rftstack serve (proxy and its
#              engine direct), then bare vLLM as it comes and bare with the engine arguments Trinity's engine runs with
#              (TRINITY_ENGINE_ARGS: the batch sizes of vLLM's engine context, not its API server's; processed
#              logprobs; seed 42; async scheduling; the mp executor), in two rounds (A B A B): is the engine's gap to
#              bare with the same request its arguments, or the Ray actor it runs in? and how far one start of the same
#              server lies from the next; every window with the machine's busy, steal and throttled CPU
#   engine3b-batch  its serve part only, Trinity's engine given `vllm serve`'s batch sizes on this GPU (8192 tokens,
#              1024 sequences a step, through the config's extra_engine_args): engine-batch-qwen3b.json
#   enginecost  bench/engine_logprobs_cost.py on the GPU: what the sampled token's logprob costs vLLM's engine per
#              step (its sampler's kernel launches on the model-runner thread, the copy to the host, the scheduler's
#              slices, the EngineCore -> frontend messages), batches of 32 and 64, processed and raw logprobs
#   fields3b-profile  bare vLLM with Trinity's engine arguments (mp) only, windows plain, with the fields and
#              numeric, then py-spy (PY_SPY) on its API server, EngineCore and worker in one window of plain
#              requests and one of numeric fields at c=64: where the fields' cost lies per process and stage
#   engine3b-profile  where Trinity's engine loses against bare with its own arguments (session W: 0.77-0.79 at c=64
#              with the same request): rftstack serve and bare with TRINITY_ENGINE_ARGS, 12 s windows with numeric
#              logprobs, then py-spy (PY_SPY) on the serve's Explorer, engine actor, EngineCore and worker (a proxy window)
#              and on bare's API server, EngineCore and worker (a window of numeric fields) at c=64
#              (with RFTSTACK_ENGINE_LOG_STATS=1: the serve's windows carry its engine's account from /metrics too)
#   interleave3b  rftstack serve and bare `vllm serve` up together on the GPU (0.4 of its memory each,
#              RFTSTACK_ENGINE_LOG_STATS=1), the long runs' levels (c=32/64, equal and 0.75-spread lengths, 16
#              requests a client) sent to one, then the other, INTERLEAVE_ROUNDS (default 4) times, the order turned
#              each round (bench/interleave.py): the ratio with the drift between two servers' starts taken out;
#              INTERLEAVE_ARGS adds arguments (e.g. --requests-per-client 32)
#   interleave3b-hop  the same with six paths on two servers: bare, through the proxy, Trinity's engine directly
#              (the proxy's own request), and bench/hop.py in front of that engine three ways (a hop that records
#              nothing: as it is, each answer held HOP_WAIT_MS (10) without CPU, its loop busy HOP_BUSY_MS (2) an
#              answer): which part of a proxy in front of the engine its steps feel (interleave-hop-qwen3b.json)
#   interleave3b-parts  the same at equal lengths only (c=32 and c=64, where the proxy's engine decodes slower than a
#              hop's, session AQ) with eight paths: bare, through the proxy, Trinity's engine directly, bench/hop.py
#              holding each answer HOP_WAIT_MS (10), releasing the answers in groups as a group commit whose commit
#              takes HOP_GROUP_MS (5; a sleep, no I/O) and committing each answer to an SQLite file on the disk (group
#              commit, synchronous=FULL: the store's write and syncs alone), and Trinity's proxy app in a plain process
#              (bench/proxy_overhead.py's child) with its recording as the serve has it (sqlite-build4+numeric) and
#              without (hop-gc+numeric), PARTS_PROXIES to name others: which part of the proxy slows its engine's steps
#              (the Explorer actor, the recording, the release in groups, the app); INTERLEAVE_ROUNDS default 4;
#              SERVE_DB_URL puts the serve's own store elsewhere (parts-qwen3b.json)
#   interleave3b-parts-shm  the same with the serve's store on /dev/shm (SERVE_DB_URL's default here:
#              sqlite:////dev/shm/rftstack-interleave-proxy.db, removed after): does the proxy's engine still step
#              slower when its commits sync no disk? (parts-shm-qwen3b.json)
#   interleave3b-engine  the same with five paths on three servers, 0.3 of the memory each: through the proxy,
#              Trinity's engine directly (the proxy's own request), bare, bare sent the proxy's own request, and bare
#              with TRINITY_ENGINE_ARGS
#   engine3b-fork0  the serve only, its vLLM worker spawned rather than forked from the engine actor
#              (RFTSTACK_VLLM_FORK_WORKERS=0): whether the fork is what costs the serve's worker its CPU per response
#              (its engine's statistics on, as in engine3b-profile)
#   engine3b-bisect  where between bare and Trinity's engine the distance lies, one start each, 12 s windows with
#              numeric logprobs: rftstack serve with its engine's statistics on (RFTSTACK_ENGINE_LOG_STATS=1,
#              patches/trinity-engine-log-stats.patch), bare with TRINITY_ENGINE_ARGS, and bare with every other
#              engine argument Trinity's engine has too (TRINITY_LIKE_ARGS): if the last is as slow as the serve, an
#              argument costs it; if it is as fast as bare, the Ray actor Trinity runs vLLM in does. Every window
#              has the engine's account (steps/s, tokens per step, running requests, the frontend's time against the
#              time scheduled): fewer running requests with steps as fast is a frontend slow to admit
#   engine3b-nice0  the serve only, as in engine3b-bisect but its Ray workers at niceness 0 (--worker-niceness 0 through
#              RFTSTACK_WORKER_NICENESS; Ray's default is 15, which its proxy, engine actor, EngineCore and worker
#              inherit, where bare runs at 0): run right after engine3b-bisect, whose serve is the same at 15
#   engine3b-anyio  patches/trinity-engine-anyio-root.patch under load: the serve with it off (RFTSTACK_ENGINE_ANYIO_ROOT=0,
#              upstream: anyio starts a worker thread for most responses of the engine's server), then the serve with it on
#              (the default) beside bare with every engine argument Trinity's, the same 12 s windows and numeric
#              requests, the engine's statistics on (~9 min; with PY_SPY each serve and bare get a profile window)
#   engine3b-context  what differs between the processes Trinity's engine actor starts and those of bare `vllm serve`,
#              then which of it costs the engine its steps: bench/process_context.py (no GPU: what each process
#              inherits, and a CPU workload in each), then bare only, 12 s windows with numeric logprobs, every engine
#              argument Trinity's ($like: TRINITY_ENGINE_ARGS TRINITY_LIKE_ARGS): as `vllm serve` runs it; with the
#              variables Trinity's engine actor sets and Ray's OMP_NUM_THREADS (TRINITY_ACTOR_ENV); and vLLM's own
#              OpenAI server inside a plain Ray actor (bench/vllm_in_ray.py, serve_profile's @ray-actor: Ray's
#              niceness, environment and default_worker.py as __main__, the EngineCore spawned from the actor and its
#              worker forked, as in the serve; no Trinity), then the same with its worker spawned as bare's is
#              (RFTSTACK_VLLM_FORK_WORKERS=0). `vllm serve` spawns its EngineCore and worker too (its CLI sets
#              VLLM_WORKER_MULTIPROC_METHOD=spawn), so the start method alone is no difference. The serve first
#              (its engine's statistics on, as in engine3b-bisect): Trinity's engine actor in the same run (~15 min;
#              CONTEXT_NO_SERVE=1 leaves it out, ~12 min; CONTEXT_SHORT=1 runs the first and third variants only;
#              CONTEXT_NO_PROCESS=1 leaves process_context.py out; CONTEXT_LEVELS=64 one level). With PY_SPY (a
#              py-spy binary) every server gets a profile window after its levels (numeric requests; the worker,
#              EngineCore and frontend sampled)
#   anyiocpu   bench/anyio_root.py on this host's CPU (no GPU): the engine's API server before a TEST DOUBLE app in a
#              Ray actor with patches/trinity-engine-anyio-root.patch on and off, and in a plain process on uvloop.run()
#              as `vllm serve` runs it; 6 rounds, 2000 requests at c=32 (~3 min)
#   cpuinfo    the host's CPUs as the guest sees them (lscpu, SMT siblings, NUMA, the cgroup's CPU limit, the GPU's
#              CPU affinity): cpuinfo.txt
#   proxycpu   bench/proxy_overhead.py on this host's CPU (the proxy in front of the TEST DOUBLE upstream, no GPU):
#              sqlite-gc and hop-gc at c=32,64, 2000 requests a level, to set the host's CPU cost beside profile3b's
#   proxycpu-process  bench/proxy_overhead.py on this host's CPU before the 0.27 s TEST DOUBLE, twice in two
#              orders: today's proxy (sqlite-gc), the recording in a process of its own (sqlite-process) and in
#              four (sqlite-process4), the prebuilt bound and forwarding only; with cores to spare each recorder
#              process has one of its own
#   proxycpu-build  bench/proxy_overhead.py on this host's CPU before the 0.27 s TEST DOUBLE: the experiences built
#              by four builder processes (sqlite-build4, patches/trinity-proxy-build-processes.patch) and on the proxy's
#              loop (sqlite-gc, today's default), in that order; BUILD_LEVELS (32,64) and BUILD_REQUESTS (1024) a level
#   proxycpu-record  the same for the recording processes: sqlite-record4, sqlite-gc, sqlite-build4, then in the other
#              order (proxy-overhead-host-record{1,2}.json); RECORD_LEVELS (32,64) and RECORD_REQUESTS (1024) a level
#   ready      time to ready only, warm caches: bare, rftstack serve, ray start + trinity run
#   ready-3b   the same on the Qwen2.5-3B-shaped model, plus rftstack serve without warm Ray workers
#              (trinity-cold, RFTSTACK_WARM_WORKERS=0); run it after a 3B step, whose runs warm the caches
#   ready-3b-late  bare, trinity (the builders started with the Explorer, patches/trinity-proxy-builders-early.patch)
#              and trinity-late (RFTSTACK_PROXY_BUILDERS_EARLY=0: with the proxy's app): time to ready only, warm caches
#              only after a step that started the 3B model in both servers (session AL ran it first: each compiled)
#   ready-3b-mp  bare, trinity and trinity-mp: time to ready only, warm caches, after a 3B step (session K's step,
#              then trinity on uni; ready-3b-exec holds the same phases and trinity-uni)
#   ready-3b-exec  bare, trinity (today's defaults), trinity-uni and trinity-mp (spawned): time to ready only, warm
#              caches, after a 3B step; the Summary's ready figure with today's defaults
#   ready-3b-fork  bare, trinity, trinity-mp and trinity-mp-fork (RFTSTACK_VLLM_FORK_WORKERS=1: the EngineCore
#              forks its worker, patches/vllm-fork-workers.patch): time to ready only, warm caches; after a 3B step
#   default    tests/gpu/test_serve_gpu.py          the embedded default
#   java       tests/gpu/test_java_agent_gpu.py     the example Java agent (the JDK's HttpClient) against serve:
#              JAVA (a Java 17+ binary; the host has none: carry a jlink runtime) and AGENT_CLASSES (its classes)
#   expose     tests/gpu/test_expose_gpu.py         serve --expose: the API key on every route, only the proxy off loopback
#   warm       tests/gpu/test_warm_workers_gpu.py  a GPU actor in a warm Ray worker sees the GPU Ray gave it
#   cluster    tests/gpu/test_cluster_gpu.py        a GPU-less head and a GPU worker in network namespaces (root;
#              iproute2's `ip`: on a host without it, put the kit of tests/gpu/ip_kit.sh first on PATH)
#   gap        bench/silent_gap.py on bare `vllm serve` (tiny): stack samples of every process in
#              the start-up's silent intervals (the unlogged gap after "init engine")
#   gap-trinity  the same on `rftstack serve` (Ray workers inherit the sampler through the head)
# Until session N (2026-12-03) the `trinity` phase and the rl step ran vLLM's uni executor, the default then; since,
# the defaults are the mp executor whose EngineCore forks its worker (phase trinity-uni: the old default). To
# reproduce a figure of an earlier session exactly, run its step with RFTSTACK_ENGINE_EXECUTOR=uni.
# Needs: the locked stack installed for python3 (rftstack bundle install), no network.
set -u
cd "$(dirname "$0")/../.."
LOGS=${LOGS:-/tmp/gs}
mkdir -p "$LOGS/results"
# a step run again with the same LOGS: its files as STEP-2 (tests/gpu/device/step_names.sh)
. tests/gpu/device/step_names.sh
rotate_steps "$LOGS"
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 RFTSTACK_GPU_RESULTS=$LOGS/results
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}  # no flashinfer-cubin in the bundle
# one torch.compile cache for every step: each test gives its serve its own XDG_CACHE_HOME, which
# would otherwise make every serve of the session compile the same model again (about a minute each)
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/vllm-cache}
# what Trinity 0.6.0's engine (trinity/common/models/vllm_model.py, AsyncEngineArgs without a usage context) runs
# with where it differs from `vllm serve`'s defaults on a GPU of >= 70 GiB: vLLM's scheduler defaults for an engine
# (2048 tokens, 128 sequences a step; its API server: 8192 and 1024), processed logprobs, seed 42, async
# scheduling, and the mp executor (rftstack's default); its disable_log_stats is left out (bare's /metrics is read).
# Sessions V and W ran it with --max-num-seqs 256 (read wrong from vLLM's code then; tests/bench/test_engine_bisect.py
# checks it against Trinity's engine since)
TRINITY_ENGINE_ARGS=${TRINITY_ENGINE_ARGS:---max-num-batched-tokens 2048 --max-num-seqs 128 --logprobs-mode processed_logprobs --seed 42 --async-scheduling --distributed-executor-backend mp}
# the rest of what Trinity's engine is built with, for the serve config of bench/serve_vs_bare.py (tests/bench/
# test_engine_bisect.py checks field by field that TRINITY_ENGINE_ARGS with these gives vLLM's AsyncEngineArgs
# what Trinity's prepare() gives it with RFTSTACK_ENGINE_LOG_STATS=1): its worker class, remote code, its sampling
# defaults as the generation config, the checkpoint weight transfer, dtype and caching spelled out, and the
# load tracking of the API server it starts in its Ray actor
TRINITY_LIKE_ARGS_DEFAULT='--worker-cls trinity.common.models.vllm_worker.TrinityGPUWorker --trust-remote-code --dtype bfloat16 --enable-prefix-caching --enable-chunked-prefill --override-generation-config {"temperature":1.0,"top_p":1.0,"top_k":-1,"max_new_tokens":1024,"repetition_penalty":1.0} --weight-transfer-config {"backend":"checkpoint"} --enable-server-load-tracking'
TRINITY_LIKE_ARGS=${TRINITY_LIKE_ARGS:-$TRINITY_LIKE_ARGS_DEFAULT}
# the variables Trinity's engine actor (vLLMRolloutModel) sets before vLLM starts, less the start method, and the
# OMP_NUM_THREADS Ray gives an actor's process: bench/process_context.py's TRINITY_ACTOR_ENV (tests/bench/
# test_process_context.py checks that the two agree and that a Ray actor's spawned process has each of them)
TRINITY_ACTOR_ENV_DEFAULT='VLLM_USE_V2_MODEL_RUNNER=0 VLLM_USE_RAY_COMPILED_DAG_CHANNEL_TYPE=shm VLLM_RAY_PER_WORKER_GPUS=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_ALLREDUCE_USE_SYMM_MEM=0 OMP_NUM_THREADS=1'
TRINITY_ACTOR_ENV=${TRINITY_ACTOR_ENV:-$TRINITY_ACTOR_ENV_DEFAULT}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(rl rel tiny qwen3b ready default)

note() { echo "$(date -u +%FT%TZ) $*" | tee -a "$LOGS/steps.txt"; }
# what the steps' processes inherit: SIGINT (mask 0x2) and SIGQUIT (0x4) must not be ignored (go.sh's detach.py)
note "signals ignored: $(grep SigIgn /proc/self/status)"

# the 3B-shaped model is written on the GPU in under a minute; do it beside the first step
(python3 bench/model_3b.py /tmp/bench/qwen3b > "$LOGS/model_3b.log" 2>&1; python3 -m rftstack tiny-model /tmp/bench/tiny >> "$LOGS/model_3b.log" 2>&1) &

if python3 -m rftstack doctor --json > "$LOGS/doctor.json" 2> "$LOGS/doctor.err"; then
    note "doctor: ok"
    serve_cmd="{python} -m rftstack serve -c {config} --run-dir {run_dir}"
else
    note "doctor: FAILED (see doctor.json); tests and benchmarks run with --skip-doctor"
    export RFTSTACK_TEST_SKIP_DOCTOR=1
    serve_cmd="{python} -m rftstack serve -c {config} --run-dir {run_dir} --skip-doctor"
fi

pytest_gpu() { local name=$1 file=$2; shift 2; python3 -m pytest -v -s -p no:cacheprovider -o addopts= --basetemp="/tmp/pt-$name" "tests/gpu/$file" "$@"; }
bench() { wait; label_args "$suffix" "$@"; python3 bench/serve_vs_bare.py --serve-cmd "$serve_cmd" --out "$LOGS/bench" "${LABELLED[@]}"; }

for step in "${steps[@]}"; do
    run=$(run_name "$LOGS" "$step"); suffix=${run#"$step"}  # "" the first time, "-2" the second
    note "start $run"
    t0=$(date +%s)
    case $step in
        rl) pytest_gpu rl test_rl_loop_gpu.py ;;
        rl-uni) RFTSTACK_ENGINE_EXECUTOR=uni pytest_gpu rl-uni test_rl_loop_gpu.py ;;
        rl-mp) RFTSTACK_ENGINE_EXECUTOR=mp RFTSTACK_VLLM_FORK_WORKERS=0 pytest_gpu rl-mp test_rl_loop_gpu.py ;;
        rl-mp-fork) RFTSTACK_ENGINE_EXECUTOR=mp RFTSTACK_VLLM_FORK_WORKERS=1 pytest_gpu rl-mp-fork test_rl_loop_gpu.py ;;
        rl-record) RFTSTACK_PROXY_RECORD_PROCESSES=auto pytest_gpu rl-record test_rl_loop_gpu.py ;;
        train) pytest_gpu train test_train_loop_gpu.py ;;
        train-record) RFTSTACK_PROXY_RECORD_PROCESSES=auto pytest_gpu train-record test_train_loop_gpu.py ;;
        train-lora) RFTSTACK_TRAIN_LORA_RANK=16 pytest_gpu train-lora test_train_loop_gpu.py ;;
        train-3b-lora) wait; RFTSTACK_TRAIN_MODEL=/tmp/bench/qwen3b RFTSTACK_TRAIN_LORA_RANK=16 pytest_gpu train-3b-lora test_train_loop_gpu.py ;;
        train-3b) wait; RFTSTACK_TRAIN_MODEL=/tmp/bench/qwen3b pytest_gpu train-3b test_train_loop_gpu.py ;;
        rel) pytest_gpu rel test_reliability_gpu.py ;;
        kill) pytest_gpu kill test_reliability_gpu.py -k worker_sigkill ;;
        bad) pytest_gpu bad test_reliability_gpu.py -k bad_requests ;;
        faults) pytest_gpu faults test_faults_gpu.py ;;
        tiny) bench --model /tmp/bench/tiny --label tiny --phases bare,trinity --budget-s 900 ;;
        qwen3b) bench --model /tmp/bench/qwen3b --label qwen3b --phases bare,trinity --budget-s 900 ;;
        qwen3b-nogroup) RFTSTACK_RECORDER_GROUP_COMMIT=0 bench --model /tmp/bench/qwen3b --label qwen3b-nogroup --phases bare,trinity --budget-s 900 ;;
        proxy3b) bench --model /tmp/bench/qwen3b --label qwen3b-gc --phases bare,trinity,trinity-nogroup --no-like-proxy \
                 --rounds 8 --spread 0.75 --spread-levels 32,64 --budget-s 900 ;;
        proxy3b-ff) bench --model /tmp/bench/qwen3b --label qwen3b-ff --phases bare,trinity,trinity-noff --no-like-proxy \
                 --rounds 8 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 --budget-s 900 ;;
        proxy3b-freeze) bench --model /tmp/bench/qwen3b --label qwen3b-freeze --phases bare,trinity,trinity-nogc --no-like-proxy \
                 --rounds 8 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 --budget-s 900 ;;
        proxy3b-exec) bench --model /tmp/bench/qwen3b --label qwen3b-exec --phases bare,trinity,trinity-uni,trinity-mp --no-like-proxy \
                 --rounds 8 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 --budget-s 900 ;;
        proxy3b-numeric) bench --model /tmp/bench/qwen3b --label qwen3b-numeric --phases bare,trinity,trinity-nonumeric,trinity-mp \
                 --no-like-proxy --rounds 8 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 --budget-s 900 ;;
        proxy3b-mp) bench --model /tmp/bench/qwen3b --label qwen3b-mp --phases bare,trinity-mp \
                 --no-like-proxy --rounds 8 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 --budget-s 900 ;;
        proxy3b-long) bench --model /tmp/bench/qwen3b --label qwen3b-long --phases bare,trinity,trinity-uni \
                 --no-like-proxy --rounds 32 --level-timeout 60 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 --budget-s 1200 ;;
        proxy3b-c32) bench --model /tmp/bench/qwen3b --label qwen3b-c32 --phases bare,trinity \
                 --rounds 32 --level-timeout 60 --concurrency 32,64 --budget-s 1200 \
              && bench --model /tmp/bench/qwen3b --label qwen3b-c32-bare-mp --phases bare \
                 --bare-extra-args "--distributed-executor-backend mp" --no-like-proxy --rounds 32 --level-timeout 60 \
                 --concurrency 32,64 --budget-s 600 \
              && python3 bench/proxy_overhead.py --out "$LOGS/bench/proxy-overhead-host-delay.json" --variants sqlite-gc,hop-gc \
                 --concurrency 32,64 --requests 1024 --upstream-delay-s 0.27 ;;
        proxy3b-spread-direct) bench --model /tmp/bench/qwen3b --label qwen3b-spread-direct --phases bare,trinity \
                 --no-like-proxy --rounds 32 --level-timeout 60 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 \
                 --engine-direct-spread --budget-s 900 ;;
        proxy3b-abba) for order in ${ABBA_ORDERS:-1:bare,trinity 2:trinity,bare}; do
                   bench --model /tmp/bench/qwen3b --label "qwen3b-abba${order%%:*}" --phases "${order#*:}" \
                     --no-like-proxy --rounds 32 --level-timeout 60 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 \
                     --budget-s 660 || break
                 done ;;
        proxy3b-build) for order in 1:bare,trinity-build,trinity-nobuild 2:trinity-build,bare; do
                   bench --model /tmp/bench/qwen3b --label "qwen3b-build${order%%:*}" --phases "${order#*:}" \
                     --no-like-proxy --rounds 32 --level-timeout 60 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 \
                     --budget-s 900 || break
                 done ;;
        proxy3b-warmup) for order in ${WARMUP_ORDERS:-1:bare,trinity,trinity-nobuild}; do
                   bench --model /tmp/bench/qwen3b --label "qwen3b-warmup${order%%:*}" --phases "${order#*:}" \
                     --no-like-proxy --rounds 32 --level-timeout 60 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 \
                     --warmup-level 32:512 --budget-s 900 || break
                 done ;;
        proxy3b-record) for order in 1:bare,trinity-record,trinity 2:trinity-record,bare; do
                   bench --model /tmp/bench/qwen3b --label "qwen3b-record${order%%:*}" --phases "${order#*:}" \
                     --no-like-proxy --rounds 32 --level-timeout 60 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 \
                     --budget-s 900 || break
                 done ;;
        proxy3b-long-fork) bench --model /tmp/bench/qwen3b --label qwen3b-long-fork --phases bare,trinity,trinity-mp-fork \
                 --no-like-proxy --rounds 32 --level-timeout 60 --spread 0.75 --spread-levels 32,64 --concurrency 32,64 --budget-s 1200 ;;
        profile3b) wait; python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out "$LOGS/bench/profile-qwen3b.json" \
                 --concurrency 32,64 --py-spy "${PY_SPY:-py-spy}" --bare ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        frontend3b) wait; python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out "$LOGS/bench/frontend-qwen3b.json" \
                 --concurrency 32,64 --bare ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} --bare-variants \
                 "default;--api-server-count 2;--distributed-executor-backend mp;VLLM_USE_RUST_FRONTEND=1;VLLM_USE_RUST_FRONTEND=1 --distributed-executor-backend mp" ;;
        frontend3b-numeric) wait; python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out "$LOGS/bench/frontend-qwen3b-numeric.json" \
                 --concurrency 32,64 --window-s 12 --bare --numeric ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} \
                 --bare-variants "default;--distributed-executor-backend mp;--distributed-executor-backend mp --api-server-count 2" ;;
        frontend3b-numeric-api2) wait; python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out "$LOGS/bench/frontend-qwen3b-numeric-api2.json" \
                 --concurrency 32,64 --window-s 12 --no-serve --bare --numeric --bare-variants "--distributed-executor-backend mp --api-server-count 2" ;;
        frontend3b-logprobs-mode) wait; python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out "$LOGS/bench/frontend-qwen3b-logprobs-mode.json" \
                 --concurrency 32,64 --window-s 12 --no-serve --bare --numeric \
                 --bare-variants "default;--logprobs-mode processed_logprobs;--distributed-executor-backend mp --logprobs-mode processed_logprobs" ;;
        frontend3b-numeric-mpfork) wait; RFTSTACK_ENGINE_EXECUTOR=mp RFTSTACK_VLLM_FORK_WORKERS=1 python3 bench/serve_profile.py \
                 --model /tmp/bench/qwen3b --out "$LOGS/bench/frontend-qwen3b-numeric-mpfork.json" --concurrency 32,64 --window-s 12 \
                 --numeric ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        engine3b) wait; python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out "$LOGS/bench/engine-args-qwen3b.json" \
                 --concurrency 32,64 --window-s 12 --bare --numeric --rounds 2 --bare-variants "default;$TRINITY_ENGINE_ARGS" \
                 ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        engine3b-batch) wait; python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out "$LOGS/bench/engine-batch-qwen3b.json" \
                 --concurrency 32,64 --window-s 12 --numeric --engine-args '{"max_num_batched_tokens": 8192, "max_num_seqs": 1024}' \
                 ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        enginecost) wait; for mode in processed_logprobs raw_logprobs; do
                   python3 bench/engine_logprobs_cost.py --device cuda --batch 32,64 --logprobs-mode $mode \
                     --out "$LOGS/bench/engine-logprobs-cost-$mode.json" || break
                 done ;;
        fields3b-profile) wait; python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out "$LOGS/bench/fields-profile-qwen3b.json" \
                 --concurrency 32,64 --window-s 12 --no-serve --bare --numeric --py-spy "${PY_SPY:-py-spy}" \
                 --bare-profile-requests plain,numeric --bare-variants "$TRINITY_ENGINE_ARGS" ;;
        engine3b-profile) wait; RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py --model /tmp/bench/qwen3b --out "$LOGS/bench/engine-profile-qwen3b.json" \
                 --concurrency 32,64 --window-s 12 --bare --numeric --py-spy "${PY_SPY:-py-spy}" --bare-profile-requests numeric \
                 --bare-variants "$TRINITY_ENGINE_ARGS" ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        interleave3b) wait; RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/interleave.py --model /tmp/bench/qwen3b \
                 --out "$LOGS/bench/interleave-qwen3b${suffix}.json" --rounds "${INTERLEAVE_ROUNDS:-4}" ${INTERLEAVE_ARGS:-} \
                 ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        interleave3b-hop) wait; RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/interleave.py --model /tmp/bench/qwen3b \
                 --out "$LOGS/bench/interleave-hop-qwen3b${suffix}.json" --rounds "${INTERLEAVE_ROUNDS:-4}" \
                 --engine-direct --hops "none;wait=${HOP_WAIT_MS:-10};busy=${HOP_BUSY_MS:-2}" ${INTERLEAVE_ARGS:-} \
                 ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        interleave3b-parts|interleave3b-parts-shm) wait
                 db_url=${SERVE_DB_URL:-}
                 [ "$step" = interleave3b-parts-shm ] && db_url=${SERVE_DB_URL:-sqlite:////dev/shm/rftstack-interleave-proxy.db}
                 RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/interleave.py --model /tmp/bench/qwen3b \
                 --out "$LOGS/bench/${step#interleave3b-}-qwen3b${suffix}.json" --rounds "${INTERLEAVE_ROUNDS:-4}" --spread 0 \
                 --engine-direct --hops "wait=${HOP_WAIT_MS:-10};group=${HOP_GROUP_MS:-5};store=disk" \
                 --proxies "${PARTS_PROXIES:-sqlite-build4+numeric,hop-gc+numeric}" ${db_url:+--db-url "$db_url"} \
                 ${INTERLEAVE_ARGS:-} ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor}
                 rc_step=$?; if [ -n "$db_url" ]; then rm -f "${db_url#sqlite:///}"*; fi; (exit $rc_step) ;;
        interleave3b-engine) wait; RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/interleave.py --model /tmp/bench/qwen3b \
                 --out "$LOGS/bench/interleave-engine-qwen3b${suffix}.json" --rounds "${INTERLEAVE_ROUNDS:-4}" \
                 --engine-direct --bare-fields --gpu-util 0.3 --bare-variants "$TRINITY_ENGINE_ARGS" ${INTERLEAVE_ARGS:-} \
                 ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        engine3b-fork0) wait; RFTSTACK_VLLM_FORK_WORKERS=0 RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py \
                 --model /tmp/bench/qwen3b --out "$LOGS/bench/engine-fork0-qwen3b.json" --concurrency 32,64 --window-s 12 \
                 --numeric ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        engine3b-nice0) wait; RFTSTACK_WORKER_NICENESS=0 RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py \
                 --model /tmp/bench/qwen3b --out "$LOGS/bench/engine-nice0-qwen3b.json" --concurrency 32,64 --window-s 12 \
                 --numeric ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        engine3b-bisect) wait; RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py --model /tmp/bench/qwen3b \
                 --out "$LOGS/bench/engine-bisect-qwen3b.json" --concurrency 32,64 --window-s 12 --bare --numeric \
                 --bare-variants "$TRINITY_ENGINE_ARGS;$TRINITY_ENGINE_ARGS $TRINITY_LIKE_ARGS" \
                 ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        engine3b-anyio) wait; RFTSTACK_ENGINE_ANYIO_ROOT=0 RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py \
                 --model /tmp/bench/qwen3b --out "$LOGS/bench/engine-anyio0-qwen3b.json" --concurrency 32,64 --window-s 12 \
                 --numeric ${PY_SPY:+--py-spy "$PY_SPY"} ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor}
                 RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py --model /tmp/bench/qwen3b \
                 --out "$LOGS/bench/engine-anyio-qwen3b.json" --bare --numeric --concurrency 32,64 --window-s 12 \
                 --bare-variants "$TRINITY_ENGINE_ARGS $TRINITY_LIKE_ARGS" \
                 ${PY_SPY:+--py-spy "$PY_SPY" --bare-profile-requests numeric} \
                 ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        engine3b-context) wait; [ -n "${CONTEXT_NO_PROCESS:-}" ] || python3 bench/process_context.py \
                 --out "$LOGS/bench/process-context-host.json" --rounds 3 > "$LOGS/process-context.txt" 2>&1
                 like="$TRINITY_ENGINE_ARGS $TRINITY_LIKE_ARGS"
                 variants="$like;$TRINITY_ACTOR_ENV $like;@ray-actor $like;@ray-actor RFTSTACK_VLLM_FORK_WORKERS=0 $like"
                 [ -n "${CONTEXT_SHORT:-}" ] && variants="$like;@ray-actor $like"
                 RFTSTACK_ENGINE_LOG_STATS=1 python3 bench/serve_profile.py --model /tmp/bench/qwen3b \
                 --out "$LOGS/bench/engine-context-qwen3b.json" --bare --numeric --concurrency "${CONTEXT_LEVELS:-32,64}" --window-s 12 \
                 ${CONTEXT_NO_SERVE:+--no-serve} \
                 --bare-variants "$variants" ${PY_SPY:+--py-spy "$PY_SPY" --bare-profile-requests numeric} \
                 ${RFTSTACK_TEST_SKIP_DOCTOR:+--serve-args=--skip-doctor} ;;
        anyiocpu) python3 bench/anyio_root.py --out "$LOGS/bench/anyio-root-host.json" --rounds 6 --requests 2000 \
                 --concurrency 32 > "$LOGS/anyio-root-host.txt" 2>&1 ;;
        cpuinfo) { lscpu; echo "--- SMT siblings"; cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list | sort | uniq -c
                   echo "--- NUMA"; ls -d /sys/devices/system/node/node* 2>&1
                   echo "--- cgroup"; cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu.stat /sys/fs/cgroup/cpuset.cpus.effective 2>&1
                   echo "--- autogroup (niceness counts within a session when 1, outside a CPU cgroup)"
                   cat /proc/sys/kernel/sched_autogroup_enabled /proc/self/autogroup /proc/self/cgroup 2>&1
                   echo "--- /proc/stat"; head -1 /proc/stat; echo "--- nvidia-smi topo"; nvidia-smi topo -m 2>&1
                 } > "$LOGS/cpuinfo.txt" 2>&1 ;;
        proxycpu) python3 bench/proxy_overhead.py --out "$LOGS/bench/proxy-overhead-host.json" --variants sqlite-gc,hop-gc \
                 --concurrency 32,64 --requests 2000 ;;
        proxycpu-process) for order in 1:sqlite-gc,sqlite-process,sqlite-process4,sqlite-prebuilt,hop-gc \
                                       2:hop-gc,sqlite-prebuilt,sqlite-process4,sqlite-process,sqlite-gc; do
                   python3 bench/proxy_overhead.py --out "$LOGS/bench/proxy-overhead-host-process${order%%:*}.json" \
                     --variants "${order#*:}" --concurrency 32,64 --requests 1024 --upstream-delay-s 0.27 || break
                 done ;;
        proxycpu-build) python3 bench/proxy_overhead.py --out "$LOGS/bench/proxy-overhead-host-build.json" \
                 --variants sqlite-build4,sqlite-gc --concurrency "${BUILD_LEVELS:-32,64}" --requests "${BUILD_REQUESTS:-1024}" \
                 --upstream-delay-s 0.27 ;;
        proxycpu-record) for order in 1:sqlite-record4,sqlite-gc,sqlite-build4 2:sqlite-build4,sqlite-gc,sqlite-record4; do
                   python3 bench/proxy_overhead.py --out "$LOGS/bench/proxy-overhead-host-record${order%%:*}.json" \
                     --variants "${order#*:}" --concurrency "${RECORD_LEVELS:-32,64}" --requests "${RECORD_REQUESTS:-1024}" \
                     --upstream-delay-s 0.27 || break
                 done ;;
        ready) bench --model /tmp/bench/tiny --label tiny-warm --phases bare,trinity,manual --ready-only --budget-s 900 ;;
        ready-3b) bench --model /tmp/bench/qwen3b --label qwen3b-warm --phases bare,trinity,trinity-cold,manual --ready-only --budget-s 900 ;;
        ready-3b-fork) bench --model /tmp/bench/qwen3b --label qwen3b-warm-fork --phases bare,trinity,trinity-mp,trinity-mp-fork \
                 --ready-only --budget-s 900 ;;
        ready-3b-exec) bench --model /tmp/bench/qwen3b --label qwen3b-warm-exec --phases bare,trinity,trinity-uni,trinity-mp \
                 --ready-only --budget-s 900 ;;
        ready-3b-late) bench --model /tmp/bench/qwen3b --label qwen3b-warm-late --phases bare,trinity,trinity-late --ready-only --budget-s 900 ;;
        ready-3b-mp) bench --model /tmp/bench/qwen3b --label qwen3b-warm-mp --phases bare,trinity,trinity-mp --ready-only --budget-s 900 ;;
        default) pytest_gpu default test_serve_gpu.py ;;
        java) pytest_gpu java test_java_agent_gpu.py ;;
        expose) pytest_gpu expose test_expose_gpu.py ;;
        cluster) pytest_gpu cluster test_cluster_gpu.py ;;
        warm) pytest_gpu warm test_warm_workers_gpu.py ;;
        gap) wait; python3 bench/silent_gap.py --out "$LOGS/gap" --ready-url http://127.0.0.1:8123/v1/models --timeout 400 \
                 -- vllm serve /tmp/bench/tiny --host 127.0.0.1 --port 8123 --gpu-memory-utilization 0.6 ;;
        gap-trinity) wait; python3 -m rftstack example-config /tmp/bench/tiny -o /tmp/gap-trinity.yaml
                 python3 bench/silent_gap.py --out "$LOGS/gap-trinity" --ready-url http://127.0.0.1:8124/v1/models --timeout 500 \
                 -- python3 -m rftstack serve -c /tmp/gap-trinity.yaml --port 8124 --run-dir /tmp/gap-trinity-run \
                 ${RFTSTACK_TEST_SKIP_DOCTOR:+--skip-doctor} ;;
        *) note "unknown step $step"; continue ;;
    esac > "$LOGS/$run.log" 2>&1
    note "end $run rc=$? $(( $(date +%s) - t0 )) s"
    # the runs' own directories (logs, status, configs) for the record; not the models or caches
    tar czf "$LOGS/$run-runs.tgz" --exclude='*.safetensors' --exclude='cache' --exclude='*.db' \
        /tmp/pt-$step "$LOGS/bench/work" 2>/dev/null
    # the serve logs' start-up lines docs/ cites, in a file that watch.sh brings back (the archive above stays here)
    bash tests/gpu/device/serve_lines.sh "$LOGS" "$step" "$t0" "$run"
done
note "all done"
