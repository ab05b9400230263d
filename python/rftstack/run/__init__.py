"""Starting and watching the services: the Ray head, Trinity serve mode, their supervisor and run directory.

The top layer: uses ``doctor`` and ``stack``; only the CLI imports it.
"""
