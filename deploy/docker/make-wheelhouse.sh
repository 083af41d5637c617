#!/usr/bin/env bash
# Host-side wheelhouse for the image, so `docker build` needs no package index (pip inside a build
# container may not reach one, and this makes the build offline and reproducible):
#   deploy/docker/make-wheelhouse.sh [TORCH_REQUIREMENT]     # e.g. 'torch==2.13.0' for a CPU image
# Fills deploy/docker/wheels/ (the Dockerfile installs from there with --no-index when it holds wheels).
# Idempotent: wheels are kept per requirement set under $FEDBAYES_CACHE (default /var/cache/fedbayes,
# or ~/.cache/fedbayes when that is not writable) and only copied when already downloaded.
set -euo pipefail
cd "$(dirname "$0")/../.."
TORCH=${1:-}
WHEELS=deploy/docker/wheels
PYTHON=${PYTHON:-python3.11}
CACHE=${FEDBAYES_CACHE:-/var/cache/fedbayes}
mkdir -p "$CACHE" 2>/dev/null && [ -w "$CACHE" ] || CACHE=$HOME/.cache/fedbayes

# One at a time: two builds filling the same wheelhouse at once (the compose and install tests did) collide in `cp`.
exec 9>"$CACHE/wheelhouse.lock"
flock 9
requirements=$("$PYTHON" deploy/docker/requirements.py --torch "$TORCH"; echo "setuptools>=68")
if [ -f "$WHEELS/requirements.txt" ] && [ "$(cat "$WHEELS/requirements.txt")" = "$requirements" ]; then
    echo "make-wheelhouse: $WHEELS is up to date ($(ls "$WHEELS"/*.whl | wc -l) wheels)"; exit 0
fi
store=$CACHE/wheelhouse-$(echo "$requirements" | sha256sum | cut -c1-16)
if [ ! -f "$store/requirements.txt" ]; then
    echo "make-wheelhouse: downloading into $store"
    rm -rf "$store" && mkdir -p "$store"
    echo "$requirements" > "$store/requirements.in"
    "$PYTHON" -m pip download --quiet --only-binary=:all: --dest "$store" -r "$store/requirements.in"
    mv "$store/requirements.in" "$store/requirements.txt"  # written last: marks a complete download
fi
rm -f "$WHEELS"/*.whl "$WHEELS/requirements.txt"
cp "$store"/*.whl "$WHEELS"/
cp "$store/requirements.txt" "$WHEELS/requirements.txt"
echo "make-wheelhouse: $(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1) in $WHEELS"
