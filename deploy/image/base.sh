#!/usr/bin/env bash
# A Python base image made from Debian's packages, for build machines that cannot pull the
# Dockerfile's default base (python:3.11.13-slim-bookworm) from a registry.
#
#   deploy/image/base.sh [TAG]        (default localhost/abstain-base:bookworm)
#
# mmdebstrap makes a minimal Debian bookworm root file system (Debian's Python 3.11 with venv,
# the CA certificates package, passwd for useradd) from the Debian archive, security updates
# included; buildah imports it as a one-layer image tagged TAG. The tarball is cached in
# var/image/ (a rerun imports it in seconds; delete it for fresh security updates). Needs
# root, mmdebstrap and buildah (Debian packages). Prints TAG.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TAG=${1:-localhost/abstain-base:bookworm}
CACHE=${ABSTAIN_IMAGE_CACHE:-$ROOT/var/image}
TARBALL=$CACHE/base-bookworm.tar
BUILDAH=(buildah --storage-driver "${STORAGE_DRIVER:-vfs}")
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org}

say() { printf 'abstain image: %s\n' "$*" >&2; }

if "${BUILDAH[@]}" inspect --type image "$TAG" >/dev/null 2>&1; then
    say "base $TAG is already in local storage"
    printf '%s\n' "$TAG"
    exit 0
fi

mkdir -p "$CACHE"
if [[ ! -s $TARBALL ]]; then
    say "making a Debian bookworm base with mmdebstrap (about 2 minutes) ..."
    started=$SECONDS
    mmdebstrap --quiet --mode=root --variant=apt \
        --include=python3,python3-venv,python-is-python3,ca-certificates,passwd \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        bookworm "$CACHE/base-bookworm.partial.tar" \
        "deb $MIRROR/debian bookworm main" \
        "deb $MIRROR/debian bookworm-updates main" \
        "deb $MIRROR/debian-security bookworm-security main"
    mv "$CACHE/base-bookworm.partial.tar" "$TARBALL"
    say "base root file system made in $((SECONDS - started)) s ($(du -h "$TARBALL" | cut -f1))"
fi

container=$("${BUILDAH[@]}" from scratch)
trap '"${BUILDAH[@]}" rm "$container" >/dev/null 2>&1 || true' EXIT
mount=$("${BUILDAH[@]}" mount "$container")
tar -C "$mount" -xf "$TARBALL"
"${BUILDAH[@]}" umount "$container" >/dev/null
"${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$container"
"${BUILDAH[@]}" commit --quiet "$container" "$TAG" >/dev/null
say "tagged the Debian-made base as $TAG"
printf '%s\n' "$TAG"
