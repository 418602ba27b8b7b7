"""gpu-labeller: label Kubernetes nodes with their GPUs and serve them to pods."""

from typing import Any


def __getattr__(name: str) -> Any:
    # Looked up on demand: importlib.metadata costs ~40 ms of start-up that `labels` does not need.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("gpu-labeller")
        except PackageNotFoundError:  # a source tree that was never installed
            return "0.0.0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
