"""The cluster layer: how gpu-labeller's processes see and change the Kubernetes API.

One adapter talks to the API (``kube``: the only module that imports the ``kubernetes`` client);
``connect`` makes it from a kubeconfig or the pod's service account; ``reflector`` keeps a local
view of a kind of object true (list, watch, relist); ``nodes`` holds the own Node's view; and
``permissions`` reports a missing permission once. The processes (``daemon``, ``plugin``,
``extender``, ``mps``) use this layer, never the client; nothing here imports a process.

Only ``kube`` and ``connect`` load the client at import time, so a process that never talks to
the API does not pay for it.
"""
