#!/usr/bin/env bash
# Make a local Debian bookworm base image for the Dockerfiles where Docker Hub is unreachable.
#
#   scripts/docker_base.sh [IMAGE]        default IMAGE: attention-distill/bookworm:local
#
# debootstrap --variant=minbase builds a bookworm root from the Debian mirror apt already uses
# (first URIs: line of /etc/apt/sources.list.d/*.sources, else the first deb line of
# /etc/apt/sources.list; DEBIAN_MIRROR overrides), then `docker import` turns it into an image.
# Idempotent: does nothing when IMAGE exists (FORCE=1 rebuilds). Needs root (debootstrap) and
# a running Docker daemon; installs debootstrap with apt-get when it is missing.
# Then: docker build --build-arg BASE_IMAGE=IMAGE -f docker/Dockerfile.cpu ...
set -euo pipefail

IMAGE=${1:-attention-distill/bookworm:local}
SUITE=${DEBIAN_SUITE:-bookworm}

log() { echo "docker_base: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v docker >/dev/null || die "no 'docker' command: install Docker (Debian: apt-get install docker.io) and start dockerd"
docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable ('docker info' fails): start it (dockerd, or systemctl start docker) and check you may use its socket"
if [[ ${FORCE:-0} != 1 ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE exists (FORCE=1 rebuilds it)"
    exit 0
fi
[[ $(id -u) == 0 ]] || die "debootstrap needs root: run 'sudo $0 $IMAGE'"

mirror() {
    local m
    m=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $1; exit}')
    [[ -n $m ]] || m=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null)
    echo "$m"
}
MIRROR=${DEBIAN_MIRROR:-$(mirror)}
[[ -n $MIRROR ]] || die "no Debian mirror found in /etc/apt/sources.list*; set DEBIAN_MIRROR=http://your.mirror/debian"

if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap with apt-get ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends debootstrap >&2 \
        || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends debootstrap >&2; } \
        || die "could not install debootstrap"
fi

ROOT=$(mktemp -d /tmp/docker-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
log "debootstrap $SUITE from $MIRROR into $ROOT (a few minutes) ..."
debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >&2 || die "debootstrap failed (see above); is $MIRROR reachable?"
# Like the official images: no apt caches or package lists in the image (the Dockerfiles run apt-get update).
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
log "importing as $IMAGE ..."
tar -C "$ROOT" -c . | docker import --change 'CMD ["bash"]' - "$IMAGE" >&2
log "done: $(docker image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
echo "$IMAGE"
