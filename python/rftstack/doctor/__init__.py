"""What is wrong before anything starts: the doctor and its checks (one module per way the stack breaks).

Uses ``stack``; used by ``run`` (serve runs the doctor as its preflight) and the CLI.
"""
