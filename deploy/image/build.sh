#!/usr/bin/env bash
# Build the project's Dockerfile with buildah (no Docker engine needed): `make image`.
#
#   deploy/image/build.sh [IMAGE]       (default localhost/abstain:dev)
#
# - The base: the Dockerfile's BASE_IMAGE (default python:3.11.13-slim-bookworm), or the
#   environment's BASE_IMAGE. Taken from local storage, else pulled; where it cannot be
#   pulled (no registry), deploy/image/base.sh makes a base from Debian's packages and the
#   build uses it in its place (build argument BASE_IMAGE). ABSTAIN_IMAGE_PULL=0 skips the
#   pull attempt.
# - The build machine's trust settings (its CA bundle and pip configuration, when it has
#   them) are mounted into the RUN steps of the first stage only (which downloads), built
#   alone first: buildah leaves an empty file where it mounted one that the image lacks
#   (/etc/pip.conf), and the image's own stage is built without them, from the cached
#   first stage. Nothing of them lands in the image.
# - DOCKERFILE picks another Dockerfile (default ./Dockerfile); STORAGE_DRIVER buildah's
#   storage driver (default vfs: works everywhere, also inside a container).
#
# Needs root and buildah (plus mmdebstrap for the Debian-made base). Prints the image name
# and its size; the build log goes to stderr.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE=${1:-localhost/abstain:dev}
DOCKERFILE=${DOCKERFILE:-$ROOT/Dockerfile}
BUILDAH=(buildah --storage-driver "${STORAGE_DRIVER:-vfs}")

say() { printf 'abstain image: %s\n' "$*" >&2; }

command -v buildah >/dev/null || { say "buildah not found (apt-get install buildah)"; exit 2; }
default_base=$(sed -n 's/^ARG BASE_IMAGE=//p' "$DOCKERFILE" | head -n 1)
base=${BASE_IMAGE:-$default_base}
if [[ -z $base ]]; then
    say "$DOCKERFILE has no ARG BASE_IMAGE=... and BASE_IMAGE is not set"
    exit 2
fi

if ! "${BUILDAH[@]}" inspect --type image "$base" >/dev/null 2>&1; then
    pulled=0
    if [[ ${ABSTAIN_IMAGE_PULL:-1} != 0 ]]; then
        say "pulling $base ..."
        if timeout 120 "${BUILDAH[@]}" pull --quiet "$base" >/dev/null 2>&1; then
            pulled=1
        else
            say "cannot pull $base"
        fi
    fi
    if [[ $pulled == 0 ]]; then
        base=$(bash "$ROOT/deploy/image/base.sh")
        say "building on $base (Debian's packages) in place of $default_base"
    fi
fi

mounts=()
for file in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf; do
    [[ -f $file ]] && mounts+=(--volume "$file:$file:ro")
done

say "building $IMAGE from $DOCKERFILE on $base ..."
started=$SECONDS
common=(bud --quiet --pull=never --isolation chroot --layers --build-arg "BASE_IMAGE=$base"
        -f "$DOCKERFILE")
"${BUILDAH[@]}" "${common[@]}" "${mounts[@]}" --target build "$ROOT" >/dev/null
"${BUILDAH[@]}" "${common[@]}" -t "$IMAGE" "$ROOT" >/dev/null
size=$("${BUILDAH[@]}" images --format '{{.Size}}' "$IMAGE" 2>/dev/null | head -n 1 || true)
say "built $IMAGE in $((SECONDS - started)) s${size:+ ($size)}"
printf '%s\n' "$IMAGE"
