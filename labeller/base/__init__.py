"""The base tier: plumbing every other tier may use (errors, logging, files of our own, signals)."""
