#!/usr/bin/env bash
# Builds inferd's container image, then prints the size of each layer.
#   bash scripts/build_image.sh cpu|cuda [TAG]      (TAG: default inferd:cpu / inferd:cuda)
#
# The builder is docker where its daemon answers, else buildah (no daemon:
# `apt-get install buildah debootstrap`). The base is $BASE when set, else
# python:3.12-slim when a registry answers, else a Debian bookworm made
# here with debootstrap and imported with `buildah from scratch`
# (localhost/inferd-base:bookworm, made once and kept).
#
# With buildah, the host's pip configuration (pip.conf, its local wheel
# directories and indexes, its CA bundle) is shared with the build
# read-only, so that a machine with a local CPU torch wheel or a package
# mirror builds from it; nothing of it stays in the image. WHEELS=DIR adds a
# directory of wheels already downloaded on this host (`pip download -d DIR
# ".[cuda,ray]"`) to what pip looks in: it takes a file found there over the
# same file on an index, so a rebuild of the dependency layer downloads
# nothing again (the CUDA wheels are several GB).
# Environment: BASE, BUILDER (docker|buildah), STORAGE_DRIVER (buildah's, e.g.
# vfs where overlay does not work), DEBIAN_MIRROR, WHEELS (buildah only).
set -euo pipefail
cd "$(dirname "$0")/.."

flavor="${1:-}"
case "$flavor" in
  cpu | cuda) ;;
  *) echo "usage: $0 cpu|cuda [TAG]" >&2; exit 2 ;;
esac
tag="${2:-inferd:$flavor}"
local_base="localhost/inferd-base:bookworm"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

docker_works() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

builder="${BUILDER:-}"
if [ -z "$builder" ]; then
  if docker_works; then
    builder=docker
  elif command -v buildah >/dev/null 2>&1; then
    builder=buildah
  else
    echo "no image builder: start a docker daemon, or apt-get install buildah debootstrap" >&2
    exit 1
  fi
fi

# A local Debian bookworm with Python 3.11 (and its venv module and headers:
# torch.compile builds C++ against them), as an image.
make_local_base() {
  if buildah inspect --type image "$local_base" >/dev/null 2>&1; then
    return
  fi
  command -v debootstrap >/dev/null || { echo "debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
  local rootfs ctr
  rootfs="$(mktemp -d /var/tmp/inferd-base.XXXXXX)"
  trap 'rm -rf "$rootfs"' RETURN
  echo "making $local_base with debootstrap ($mirror)" >&2
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-dev,ca-certificates \
    bookworm "$rootfs" "$mirror" >/dev/null
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  ctr="$(buildah from scratch)"
  buildah copy --quiet "$ctr" "$rootfs" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$ctr"
  buildah commit --quiet --rm "$ctr" "$local_base" >/dev/null
}

registry_answers() {
  case "$builder" in
    docker) timeout 20 docker pull --quiet python:3.12-slim >/dev/null 2>&1 ;;
    buildah) timeout 20 buildah pull --quiet docker.io/library/python:3.12-slim >/dev/null 2>&1 ;;
  esac
}

base="${BASE:-}"
if [ -z "$base" ]; then
  if registry_answers; then
    base=python:3.12-slim
  elif [ "$builder" = buildah ]; then
    make_local_base
    base="$local_base"
  else
    echo "no registry answers and docker cannot import a base here: set BASE" >&2
    exit 1
  fi
fi

args=(--build-arg "BASE=$base" -f "Dockerfile.$flavor" -t "$tag")
start=$(date +%s)
if [ "$builder" = docker ]; then
  docker build "${args[@]}" .
else
  # What the host's pip reads (its config files, environment and user
  # config alike), as one pip.conf, with the local directories it names.
  volumes=()
  pip_conf="$(mktemp /tmp/inferd-build-pip.XXXXXX.conf)"
  trap 'rm -f "$pip_conf"' EXIT
  python3 -m pip config list 2>/dev/null | python3 -c '
import re, sys
seen = {}
for line in sys.stdin:
    match = re.match(r"^[^.]*\.([a-z-]+)=(.*)$", line.strip())
    if match:
        seen[match.group(1)] = match.group(2).strip("\x27\"")
print("[global]")
for key, value in seen.items():
    print(f"{key} = {value}")
' > "$pip_conf"
  volumes+=(--volume "$pip_conf:/etc/pip.conf:ro")
  found_local=0
  # A local index (.../simple) links to its files beside it: share its parent.
  for path in $(grep -oE "(file://)?/[^ ]+" "$pip_conf" | sed 's|^file://||; s|/simple/*$||' | sort -u); do
    if [ -e "$path" ]; then
      volumes+=(--volume "$path:$path:ro")
      case "$path" in *.crt | *.pem | *.txt) ;; *) found_local=1 ;; esac
    fi
  done
  if [ -n "${WHEELS:-}" ]; then
    [ -d "$WHEELS" ] || { echo "WHEELS=$WHEELS is not a directory" >&2; exit 1; }
    wheels="$(cd "$WHEELS" && pwd)"
    volumes+=(--volume "$wheels:$wheels:ro")
    if grep -q '^find-links = ' "$pip_conf"; then
      sed -i "s|^find-links = .*|& $wheels|" "$pip_conf"
    else
      echo "find-links = $wheels" >> "$pip_conf"
    fi
  fi
  if [ "$found_local" = 1 ]; then
    # The host's pip finds its packages where it is configured to: no
    # other index is needed, and one that does not answer would only stall.
    args+=(--build-arg "PIP_EXTRA_ARGS=")
  fi
  buildah bud --layers --isolation chroot "${volumes[@]}" "${args[@]}" .
fi
echo "built $tag ($builder, base $base) in $(( $(date +%s) - start )) s"

# Each layer's size, beside the step that made it.
if [ "$builder" = docker ]; then
  docker history --format '{{.Size}}\t{{.CreatedBy}}' "$tag"
else
  buildah inspect --type image "$tag" | python3 -c '
import json, sys
image = json.load(sys.stdin)
manifest = json.loads(image["Manifest"])
layers = iter(manifest["layers"])
total = 0
for step in image["OCIv1"].get("history", []):
    if step.get("empty_layer"):
        continue
    size = next(layers)["size"]
    total += size
    made_by = step.get("created_by", "")[:110]
    print(f"{size / 2**20:10.1f} MiB  {made_by}")
print(f"{total / 2**20:10.1f} MiB  in all")
'
fi
