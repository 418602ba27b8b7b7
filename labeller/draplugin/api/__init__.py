"""Generated from ../registration.proto and ../dra.proto by ``python -m labeller.draplugin.generate``; do not edit."""
