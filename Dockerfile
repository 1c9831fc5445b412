# inferpool's container image: `inferpool serve /mnt/models` as uid 1000 under tini.
#
#   docker build -t inferpool:0.1.0 .                          (python:3.11-slim, every runtime)
#   docker build --build-arg EXTRAS=sklearn,lightgbm -t inferpool:0.1.0-small .
#   buildah bud --build-arg BASE=localhost/inferpool-base:KEY ...   (tests/image, no registry)
#
# BASE is any Debian-family image with CPython 3.11 as `python3`: the official slim image
# (python at /usr/local/bin, headers present, no compiler, no tini) or Debian bookworm's
# python3 (/usr/bin/python3). Each stage installs with apt only what its base lacks.
# Every package comes from requirements/image.lock (scripts/lock_image.sh), used as a
# constraint file with hashes: any subset of EXTRAS gets the same pins, checked on download.
# See docs/deploy/image.md.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
# The compiler and Python's headers build the C extensions (the tree kernel and the ring's
# atomics, setup.py) in this stage only; the runtime stage copies the result.
RUN set -eu; \
    need=""; \
    command -v gcc >/dev/null || need="gcc libc6-dev"; \
    python3 -c 'import sysconfig, os, sys; \
        sys.exit(not os.path.exists(sysconfig.get_path("include") + "/Python.h"))' \
        || need="$need python3-dev"; \
    python3 -c 'import ensurepip' 2>/dev/null || need="$need python3-venv"; \
    if [ -n "$need" ]; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need; \
    fi
# The image's Python environment is a venv at /opt/inferpool, built here and copied whole
# into the runtime stage: the compiler and the wheels stay behind, and the same path on the
# same base keeps its interpreter link and its scripts' #! lines valid.
ENV PIP_NO_CACHE_DIR=1 PIP_PROGRESS_BAR=off PIP_DISABLE_PIP_VERSION_CHECK=1
ARG EXTRAS=all
# The dependencies first, in a layer that only the lock, pyproject.toml or EXTRAS change:
# a change to inferpool's sources rebuilds the next layer alone. pip itself comes first, its
# entry cut out of the lock (from `pip==` to the line that ends the entry): older pips
# (bookworm's 23.0) do not apply a constraint file's hashes; 26 does, to every package.
# setuptools and wheel (the build backend) come from the lock too.
RUN --mount=type=bind,source=requirements/image.lock,target=/tmp/image.lock \
    --mount=type=bind,source=pyproject.toml,target=/tmp/pyproject.toml \
    --mount=type=bind,source=scripts/image_requirements.py,target=/tmp/image_requirements.py \
    set -eu; \
    python3 -m venv /opt/inferpool; \
    pip=/opt/inferpool/bin/pip; \
    sed -n '/^pip==/,/[^\\]$/p' /tmp/image.lock >/tmp/pip.txt; \
    $pip install --require-hashes -r /tmp/pip.txt; \
    python3 /tmp/image_requirements.py "$EXTRAS" /tmp/pyproject.toml >/tmp/requirements.txt; \
    $pip install -c /tmp/image.lock -r /tmp/requirements.txt setuptools wheel
# inferpool's wheel, built from the sources (COPY applies .dockerignore; a bind mount of the
# context would not, in buildah 1.28), then installed pinned by its own hash, so that every
# requirement carries one; the build backend goes (a package an extra needs comes back with
# its pin).
COPY . /src
RUN set -eu; \
    pip=/opt/inferpool/bin/pip; \
    $pip wheel --no-build-isolation --no-deps /src -w /wheels; \
    $pip uninstall --yes setuptools wheel packaging; \
    wheel=$(ls /wheels/inferpool-*.whl); \
    echo "inferpool[$EXTRAS] @ file://$wheel --hash=sha256:$(sha256sum "$wheel" | cut -d' ' -f1)" \
        >/tmp/inferpool.txt; \
    $pip install -c /src/requirements/image.lock -r /tmp/inferpool.txt; \
    /opt/inferpool/bin/python -c 'import inferpool.runtimes.trees._kernel, inferpool.engine.ipc._atomics'

FROM ${BASE}
ARG EXTRAS=all
# tini is PID 1: it forwards SIGTERM/SIGINT to the server and reaps orphans. Without -g:
# the server alone gets the signal and drains, then stops its workers itself, last.
# LightGBM's wheel links the system's OpenMP runtime (libgomp1; the build stage has it with
# gcc, neither base has it otherwise).
RUN set -eu; \
    need=""; \
    [ -x /usr/bin/tini ] || need="tini"; \
    ldconfig -p | grep -q 'libgomp\.so\.1 ' || need="$need libgomp1"; \
    if [ -n "$need" ]; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    groupadd --gid 1000 inferpool; \
    useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin inferpool; \
    mkdir -p /mnt/models
COPY --from=build /opt/inferpool /opt/inferpool
# Numeric, so that Kubernetes' runAsNonRoot can check it. Models are mounted read-only at
# /mnt/models (KServe's storage initializer puts them there); no VOLUME, which would leave an
# anonymous volume behind on every `docker run` that mounts nothing. The worker pool passes
# payloads in memfds: no /dev/shm is needed.
USER 1000:1000
WORKDIR /home/inferpool
ENV PATH=/opt/inferpool/bin:$PATH \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title="inferpool" \
      org.opencontainers.image.description="Open Inference Protocol (KServe V2) server for classical ML models" \
      io.inferpool.extras="${EXTRAS}"
EXPOSE 8080 8081 8082
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["inferpool", "serve", "/mnt/models"]
