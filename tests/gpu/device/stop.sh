#!/usr/bin/env bash
# On the GPU host: stop a session's processes. Every pattern is bracketed, so that it never matches the
# command line of the shell that runs it (an unbracketed `pkill -f "vllm serve"` in a call whose own
# command holds that text kills the call's shell: session K).
for p in 'host_[s]ession.sh' 'serve_[v]s_bare' 'serve_[p]rofile' 'rftstack [s]erve' 'vllm [s]erve' 'trinity [r]un' 'py[t]est'; do
    pkill -f "$p" 2>/dev/null
done
sleep 3; ray stop --force >/dev/null 2>&1
pkill -9 -f 'VLLM::[E]ngine' 2>/dev/null; pkill -9 -f 'VLLM::[W]orker' 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader
