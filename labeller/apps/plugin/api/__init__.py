"""Generated from ../api.proto by ``python -m labeller.apps.plugin.generate``; do not edit."""
