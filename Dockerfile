# trainbox image.
#   docker build -t trainbox .            then   docker run --rm trainbox doctor
#
# Status: this file is not built by CI yet. The hardened, CI-built image (base pinned by digest,
# lock file, wheel install, OCI labels, wheelhouse builds) is the container issue's work; until
# then treat this as a readable recipe, not a tested artifact.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# Settings live in ENV, not in the entrypoint: `apptainer exec`, Kubernetes `command:` and
# Pyxis never run the entrypoint.
ENV PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PATH=/opt/trainbox/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && python -m venv /opt/trainbox

COPY pyproject.toml README.md /src/
COPY src /src/src
RUN /opt/trainbox/bin/pip install --no-cache-dir /src && rm -rf /src
COPY entrypoint/trainbox-entrypoint.sh /opt/trainbox/bin/trainbox-entrypoint

RUN useradd --create-home --uid 1000 trainbox
USER trainbox
WORKDIR /home/trainbox

ENTRYPOINT ["tini", "--", "trainbox-entrypoint"]
