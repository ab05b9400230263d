"""rftstack: a reproducible install and supervised launcher for Trinity-RFT serve mode."""

__version__ = "0.1.0"
