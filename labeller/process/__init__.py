"""What every long-running process of gpu-labeller shares: one loop (``loop``), the config in force
and how it changes while the process runs (``configsource``), and how a process is served: signals
and its health and metrics endpoints (``serve``); and the devices' health checks the plugins share
(``health``). ``run``, ``device-plugin``, ``dra-plugin`` and ``mps-control-daemon`` are each a
``Service`` on this loop."""
