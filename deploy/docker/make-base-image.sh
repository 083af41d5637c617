#!/usr/bin/env bash
# A Debian bookworm + Python 3.11 base image made locally, for machines that cannot pull from an image
# registry: mmdebstrap builds the root filesystem from Debian's package mirror and `docker import`
# turns it into an image. Build the project image on it with
#   docker build --build-arg BASE_IMAGE=fedbayes-base:bookworm ...
# Idempotent: the image is kept by Docker and the root filesystem tarball under $FEDBAYES_CACHE.
#
#   deploy/docker/make-base-image.sh [TAG]      # as root; default TAG fedbayes-base:bookworm
set -euo pipefail

TAG=${1:-fedbayes-base:bookworm}
CACHE=${FEDBAYES_CACHE:-/var/cache/fedbayes}
ROOTFS_TAR=$CACHE/base-bookworm-python3.tar
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv,ca-certificates

say() { echo "make-base-image: $*"; }
if docker image inspect "$TAG" >/dev/null 2>&1; then
    say "$TAG exists"; exit 0
fi
if [ ! -f "$ROOTFS_TAR" ]; then
    command -v mmdebstrap >/dev/null || {
        say "installing mmdebstrap"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq mmdebstrap >/dev/null
    }
    mkdir -p "$CACHE"
    say "mmdebstrap bookworm ($PACKAGES) -> $ROOTFS_TAR"
    rm -rf "$ROOTFS_TAR" "$ROOTFS_TAR.partial"
    mmdebstrap --quiet --format=tar --variant=minbase --include="$PACKAGES" bookworm "$ROOTFS_TAR.partial" "$MIRROR"
    mv "$ROOTFS_TAR.partial" "$ROOTFS_TAR"
fi
say "docker import -> $TAG"
docker import -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' "$ROOTFS_TAR" "$TAG" >/dev/null
docker run --rm "$TAG" python3 --version
