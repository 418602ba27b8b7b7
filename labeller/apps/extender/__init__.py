"""The gpushare-compatible scheduler extender: per-GPU memory placement (``placement``), the cluster
as the extender sees it (``cache``, fed by list and watch), binding with a per-node allocation lock
(``binder``), the kube-scheduler extender protocol over HTTP (``server``) and the commands (``cli``)."""
