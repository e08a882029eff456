# trainbox: one image for docker, podman, Apptainer/Slurm and Kubeflow.
#
#   GPU image (CUDA torch from the default index):
#     docker build -t trainbox:gpu .
#   CPU image from the public index:
#     docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu -t trainbox:cpu .
#   CPU image with no index at all, as CI builds it (tests/container/image.py; the base is
#   Debian bookworm bootstrapped with debootstrap and `podman import`-ed):
#     scripts/wheelhouse && podman build --build-arg BASE_IMAGE=localhost/trainbox-base:bookworm -t trainbox:cpu .
#   Run: docker run --rm --gpus all --shm-size=8g trainbox:gpu [train.max_steps=200 ...]
#
# Build args: BASE_IMAGE (pinned by digest; any Debian bookworm with or without python3/tini),
# TORCH_SPEC, TORCH_INDEX_URL, VERSION, REVISION, CREATED (OCI labels, also exported as
# TRAINBOX_IMAGE_* so run.json records which image ran). A wheelhouse/ directory in the build
# context (scripts/wheelhouse fills it) makes the build use no package index at all.

# debian:bookworm-slim as pinned when this file was written; refresh with
# `crane digest debian:bookworm-slim` (or `docker buildx imagetools inspect`).
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim@sha256:4b50eb66f977b4062683ff434ef18ac191da862dbe966961bc11990cf5791a8d

FROM ${BASE_IMAGE} AS base
# Debian's python3 and tini: installed only when the base lacks them (a bootstrapped base
# that already has them needs no network here).
RUN if ! command -v python3 >/dev/null || ! command -v tini >/dev/null \
        || ! python3 -c "import ensurepip, venv" 2>/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv tini ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi

FROM base AS builder
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=
COPY . /src
RUN set -eu; \
    python3 -m venv /opt/trainbox; \
    pip=/opt/trainbox/bin/pip; \
    if [ -d /src/wheelhouse ]; then source="--no-index --find-links /src/wheelhouse"; \
    else source="${TORCH_INDEX_URL:+--extra-index-url $TORCH_INDEX_URL}"; fi; \
    $pip install --no-cache-dir $source -r /src/requirements.lock "$TORCH_SPEC"; \
    $pip install --no-cache-dir $source setuptools wheel; \
    $pip wheel --no-cache-dir --no-deps --no-build-isolation -w /tmp/dist /src; \
    $pip install --no-cache-dir --no-deps /tmp/dist/trainbox-*.whl; \
    $pip uninstall -y setuptools wheel; \
    install -m 0755 /src/entrypoint/trainbox-entrypoint.sh /opt/trainbox/bin/trainbox-entrypoint

FROM base AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
COPY --from=builder /opt/trainbox /opt/trainbox
RUN useradd --create-home --uid 1000 --shell /bin/sh trainbox
LABEL org.opencontainers.image.title="trainbox" \
      org.opencontainers.image.description="PyTorch DDP entrypoint for torchrun, mpirun, Slurm and Kubeflow" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
# Every runtime setting lives here, not in the entrypoint: `apptainer exec`, a Kubernetes
# `command:` and Pyxis never run the entrypoint.
ENV PATH=/opt/trainbox/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    TRAINBOX_IMAGE_VERSION=${VERSION} \
    TRAINBOX_IMAGE_REVISION=${REVISION} \
    TRAINBOX_IMAGE_CREATED=${CREATED}
USER 1000
WORKDIR /home/trainbox
# tini is PID 1 so SIGTERM/SIGUSR1 reach Python, and zombies are reaped.
ENTRYPOINT ["tini", "--", "trainbox-entrypoint"]
