"""Discovery backends: one module per source (PCI bus, NVIDIA NVML, AMD sysfs, DMI, simulation).

Every backend reads from a host root directory so it can be pointed at a fixture tree.
"""
