"""The model tier: what a node has and what it offers, in plain data (no I/O, no vendor, no cluster)."""
