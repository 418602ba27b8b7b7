"""MkDocs hooks (``hooks:`` in mkdocs.yml): the snippets extension reads README.md from the checkout's root,
whichever directory mkdocs runs in (its base_path is otherwise relative to the working directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def on_config(config: Any) -> Any:
    root = str(Path(config.config_file_path).resolve().parent)
    config.mdx_configs.setdefault("pymdownx.snippets", {})["base_path"] = [root]
    return config
