"""Getting the stack to an offline host: the plan from the lock, fetching, building, the part layout and the installer.

Uses ``stack``. ``installer`` is copied into every bundle and runs on the target's bare Python (standard library only).
"""
