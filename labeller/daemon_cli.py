"""PLACEHOLDER: `run` and `cleanup` commands, being written."""

import click


@click.command()
def run() -> None:
    """Keep this node's labels true on the cluster."""
    raise click.ClickException("not written yet")


@click.command()
def cleanup() -> None:
    """Remove every label gpu-labeller owns."""
    raise click.ClickException("not written yet")
