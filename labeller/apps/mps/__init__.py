"""``gpu-labeller mps-control-daemon``: runs and watches the NVIDIA MPS control daemons the config's
``sharing.mps`` needs, and says which are ready (vendors/nvidia/mps.py has the shared facts)."""
