"""gpu-labeller: label Kubernetes nodes with their GPUs and serve them to pods."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpu-labeller")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
