"""Generated from ../api.proto by ``python -m labeller.plugin.generate``; do not edit."""
