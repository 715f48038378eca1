#!/usr/bin/env bash
# Debian packages FiloPy's tests need beyond the machine's base image, installed once.
#   docker-compose: validates docker-compose.yml without a Docker engine (`docker-compose config`).
set -euo pipefail
need=()
command -v docker-compose >/dev/null || need+=(docker-compose)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "[system-deps] missing Debian packages: ${need[*]} (run as root or: sudo apt-get install ${need[*]})" >&2
  exit 1
fi
echo "[system-deps] installing ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
