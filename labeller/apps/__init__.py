"""The applications: one package per long-running process (daemon, device plugin, DRA plugin, extender, MPS
supervisor); none imports another."""
