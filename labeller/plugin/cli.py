"""PLACEHOLDER: `device-plugin` command, being written."""

import click


@click.command("device-plugin")
def device_plugin() -> None:
    """Serve this node's GPUs to the kubelet."""
    raise click.ClickException("not written yet")
