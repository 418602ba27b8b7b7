"""Generated from ../registration.proto and ../dra.proto by ``python -m labeller.apps.draplugin.generate``; do not edit."""
