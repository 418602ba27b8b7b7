"""The host tier: the machine a command works on (probing it through the vendors) and the tools that read its labels."""
