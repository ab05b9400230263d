"""The doctor's checks: one module per way the stack breaks, each a pure ``check(...)`` over facts
read by a thin reader in the same module. `rftstack.doctor.collect` wires them together.

Nothing here imports torch, vllm, ray or trinity: facts come from files, ELF headers, ``ast`` and
short subprocesses, so the whole doctor runs in seconds on a machine without a GPU.
"""
