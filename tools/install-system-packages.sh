#!/usr/bin/env bash
# Debian packages the test suite needs beyond Python and Node: a real Redis server
# (redis-server 7.0.15) for the Redis Streams backend and Chromium for the dashboard's
# browser tests. Installs only what is missing; needs root (CI runs as root). A
# developer without root installs them once by hand: see README.md.
set -euo pipefail
needed=()
command -v redis-server >/dev/null 2>&1 || needed+=(redis-server)
command -v chromium >/dev/null 2>&1 || needed+=(chromium)
[ ${#needed[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${needed[*]} (run: sudo apt-get install ${needed[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${needed[@]}" >/dev/null
