# trainbox: one image for docker, podman, Apptainer/Slurm and Kubeflow.
#
#   GPU image (CUDA torch from PyPI, requirements-cuda.lock):
#     docker build -t trainbox:gpu .
#   CPU image (torch's CPU build from PyTorch's CPU index, requirements-cpu.lock):
#     docker build --build-arg VARIANT=cpu -t trainbox:cpu .
#   CPU image with no index at all, as CI builds it (tests/container/image.py; the base is
#   Debian bookworm bootstrapped with debootstrap and `podman import`-ed):
#     scripts/wheelhouse cpu && podman build --build-arg VARIANT=cpu \
#       --build-arg BASE_IMAGE=localhost/trainbox-base:bookworm-slim -t trainbox:cpu .
#   Reproducible (same commit, base and wheelhouse => same image digest; docs/image.md):
#     t=$(git log -1 --format=%ct)
#     podman build --timestamp "$t" --build-arg SOURCE_DATE_EPOCH="$t" \
#       --build-arg REVISION="$(git rev-parse HEAD)" ...
#     docker buildx build --build-arg SOURCE_DATE_EPOCH="$t" \
#       --output type=image,name=trainbox:cpu,rewrite-timestamp=true ...
#   Run: docker run --rm --gpus all --shm-size=8g trainbox:gpu [train.max_steps=200 ...]
#
# Build args: BASE_IMAGE (pinned by digest; any Debian bookworm with or without python3/tini),
# VARIANT (cpu or cuda: which lock), SOURCE_DATE_EPOCH (clamps bytecode and the user database
# to the commit's time), VERSION, REVISION, CREATED (OCI labels, also exported as
# TRAINBOX_IMAGE_* so run.json records which image ran). A wheelhouse/ directory in the build
# context (scripts/wheelhouse fills it) makes the build use no package index at all.
# Provenance: /opt/trainbox/provenance/ holds the lock, its sha256, the revision and an SBOM.

# debian:bookworm-slim as pinned when this file was written; refresh with
# `crane digest debian:bookworm-slim` (or `docker buildx imagetools inspect`).
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim@sha256:4b50eb66f977b4062683ff434ef18ac191da862dbe966961bc11990cf5791a8d

FROM ${BASE_IMAGE} AS base
# Debian's python3 and tini: installed only when the base lacks them (a bootstrapped base
# that already has them needs no network here).
# apt's logs and caches carry the install time: they go, though an apt install is only as
# reproducible as the archive it reads.
RUN if ! command -v python3 >/dev/null || ! command -v tini >/dev/null \
        || ! PYTHONDONTWRITEBYTECODE=1 python3 -c "import ensurepip, venv" 2>/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv tini ca-certificates \
      && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/cache/ldconfig/aux-cache \
        /var/cache/debconf/*-old /var/lib/dpkg/*-old; \
    fi

FROM base AS builder
ARG VARIANT=cuda
ARG REVISION=unknown
# Set, it makes pip write hash-based .pyc files (no install time inside) and the user database
# carry that day; BuildKit passes the commit's time itself, podman needs the build arg.
ARG SOURCE_DATE_EPOCH
ENV PYTHONDONTWRITEBYTECODE=1
COPY . /src
RUN set -eu; \
    lock=/src/requirements-$VARIANT.lock; \
    test -f "$lock" || { echo "VARIANT=$VARIANT: no requirements-$VARIANT.lock" >&2; exit 2; }; \
    if [ -d /src/wheelhouse ]; then source="--no-index --find-links /src/wheelhouse"; \
    elif [ "$VARIANT" = cpu ]; then source="--extra-index-url https://download.pytorch.org/whl/cpu"; \
    else source=""; fi; \
    python3 -m venv /opt/trainbox; \
    pip="/opt/trainbox/bin/pip --no-cache-dir --disable-pip-version-check"; \
    $pip install $source --only-binary=:all: --require-hashes --no-deps -r "$lock"; \
    $pip install --no-index --no-deps --no-build-isolation /src; \
    install -m 0755 /src/entrypoint/trainbox-entrypoint.sh /opt/trainbox/bin/trainbox-entrypoint; \
    sh /src/docker/slim /opt/trainbox; \
    /opt/trainbox/bin/python /src/docker/provenance.py --lock "$lock" --revision "$REVISION" \
      --variant "$VARIANT" --out /opt/trainbox/provenance

FROM base AS runtime
ARG VARIANT=cuda
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE_DATE_EPOCH
# NCCL dlopens libibverbs.so.1 when it starts; without it, it runs over TCP sockets, several
# times slower, with no error. The CUDA image carries Debian's verbs userspace: the library, its
# providers (mlx5, EFA, irdma, bnxt_re, ...) and librdmacm. The host still brings the kernel
# drivers and /dev/infiniband (docs/image.md, "RDMA"). The CPU image goes without: gloo uses
# TCP only. Installed only when missing, as above.
RUN if [ "$VARIANT" = cuda ] \
        && ! dpkg -s libibverbs1 ibverbs-providers librdmacm1 >/dev/null 2>&1; then \
      apt-get update \
      && apt-get install -y --no-install-recommends libibverbs1 ibverbs-providers librdmacm1 \
      && apt-get clean \
      && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/cache/ldconfig/aux-cache \
        /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/cache/apt/*.bin; \
    fi
COPY --from=builder /opt/trainbox /opt/trainbox
# useradd dates the password's last change (/etc/shadow) from SOURCE_DATE_EPOCH when set.
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
# tini is PID 1 so SIGTERM/SIGUSR1 reach Python, and zombies are reaped. -s: where it is not PID 1
# (a SIF converted straight from this image runs the ENTRYPOINT in the host's process table) it
# still reaps them, as a subreaper, instead of warning about it at every start.
ENTRYPOINT ["tini", "-s", "--", "trainbox-entrypoint"]
