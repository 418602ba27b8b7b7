# syntax=docker/dockerfile:1
# gpu-labeller: node labeller (`gpu-labeller run`) and kubelet device plugin (`gpu-labeller device-plugin`).
#   docker build -t gpu-labeller:0.1.0 .
#   docker build --build-arg EXTRAS=amd -t gpu-labeller:0.1.0-amd .   # adds pyamdgpuinfo (GPL-3.0-only)
# The image runs as uid 65532; the device-plugin DaemonSet overrides runAsUser to 0 (kubelet socket dir).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# Optional extras of the project, e.g. "amd". Empty by default: pyamdgpuinfo is GPL-3.0-only.
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/gpu-labeller
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY labeller ./labeller
COPY vendors ./vendors
# Build the wheel, then install it (and only it) into the venv that the runtime stage copies.
RUN /opt/gpu-labeller/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && set -- /wheels/gpu_labeller-*.whl \
 && /opt/gpu-labeller/bin/pip install "$1${EXTRAS:+[$EXTRAS]}" \
 && /opt/gpu-labeller/bin/pip uninstall --yes pip setuptools

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-labeller" \
      org.opencontainers.image.description="Kubernetes node labeller and device plugin for NVIDIA and AMD GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/gpu-labeller/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /opt/gpu-labeller /opt/gpu-labeller
USER 65532:65532
ENTRYPOINT ["gpu-labeller"]
CMD ["run"]
