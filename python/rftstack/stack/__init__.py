"""What is installed and how it is bent: the lock, the policy, metadata relaxations, source patches, the env report.

The lowest layer: it imports nothing else of rftstack but ``errors``. ``policy``, ``patches`` and ``relax`` also run as
plain scripts on a bare Python (the Nix build, an install without rftstack), so they use the standard library only.
"""
