# syntax=docker/dockerfile:1
# gpu-labeller: node labeller (`gpu-labeller run`) and kubelet device plugin (`gpu-labeller device-plugin`).
#   docker build -t gpu-labeller:0.1.0 .
#   docker build --build-arg EXTRAS=amd -t gpu-labeller:0.1.0-amd .   # adds pyamdgpuinfo (GPL-3.0-only)
# The image runs as uid 65532; the device-plugin DaemonSet overrides runAsUser to 0 (kubelet socket dir).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# Optional extra of the project, e.g. "amd" (deploy/image/requirements-amd.lock). Empty by default: pyamdgpuinfo
# is GPL-3.0-only.
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/gpu-labeller
WORKDIR /src
# The runtime dependencies exactly as locked: versions and file hashes (deploy/image/lock.py writes the lock), and
# nothing else; in their own layer, so that a change to the code does not reinstall them.
COPY deploy/image/requirements.lock deploy/image/requirements-amd.lock ./deploy/image/
RUN set -- -r deploy/image/requirements.lock \
 && if [ -n "$EXTRAS" ]; then set -- "$@" -r "deploy/image/requirements-$EXTRAS.lock"; fi \
 && /opt/gpu-labeller/bin/pip install --no-deps --no-compile --require-hashes "$@"
COPY pyproject.toml README.md LICENSE ./
COPY labeller ./labeller
COPY vendors ./vendors
# Build the wheel and install it (its dependencies are the lock's), without pip. Then: drop kubernetes.aio, the
# client's asyncio twin (gpu-labeller uses the synchronous client; the lock leaves out its aiohttp), and compile
# what the processes import: everything but the client's generated API classes and models, which gpu-labeller
# never imports (it sends its requests through the generic ApiClient). The root filesystem is read-only in the
# chart: a module without its .pyc is compiled again at every start. unchecked-hash: the image never changes.
RUN /opt/gpu-labeller/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && set -- /wheels/gpu_labeller-*.whl \
 && /opt/gpu-labeller/bin/pip install --no-deps --no-compile "$1" \
 && /opt/gpu-labeller/bin/pip uninstall --yes pip setuptools \
 && site="$(/opt/gpu-labeller/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
 && rm -r "$site/kubernetes/aio" \
 && /opt/gpu-labeller/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash \
      -x '/kubernetes/client/(api|models)/(?!__init__[.]py$)' "$site"

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-labeller" \
      org.opencontainers.image.description="Kubernetes node labeller and device plugin for NVIDIA and AMD GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
ENV PATH=/opt/gpu-labeller/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /opt/gpu-labeller /opt/gpu-labeller
USER 65532:65532
ENTRYPOINT ["gpu-labeller"]
CMD ["run"]
