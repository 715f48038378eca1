#!/usr/bin/env bash
# Debian packages FiloPy's tests need beyond the machine's base image, installed once.
#   docker-compose: validates docker-compose.yml without a Docker engine (`docker-compose config`).
#   prometheus: `promtool query` (a real Prometheus API client) and the Prometheus server, a real
#     remote-write sender.
#   victoria-metrics: vmagent (a real remote-write and Influx sender) and the single-node server, the
#     peer of bench/bench_ingest_http.py.
#   kcat: a real Kafka client that is not FiloPy's, for direct-to-Kafka producer tests.
#   chromium: the real browser the web console's test drives (through Playwright).
#   iptables, iproute2: the many-hosts test bed (tests/netbed): network namespaces, a bridge,
#     links cut inside a namespace.
#   redis-server: the external store of Ray's control plane (GCS fault tolerance), so the head
#     can die and come back without stopping the workers.
set -euo pipefail
need=()
command -v docker-compose >/dev/null || need+=(docker-compose)
{ command -v promtool && command -v prometheus; } >/dev/null || need+=(prometheus)
{ command -v victoria-metrics && command -v vmagent; } >/dev/null || need+=(victoria-metrics)
command -v kcat >/dev/null || need+=(kcat)
command -v chromium >/dev/null || need+=(chromium)
command -v iptables >/dev/null || need+=(iptables)
command -v ip >/dev/null || need+=(iproute2)
command -v redis-server >/dev/null || need+=(redis-server)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "[system-deps] missing Debian packages: ${need[*]} (run as root or: sudo apt-get install ${need[*]})" >&2
  exit 1
fi
echo "[system-deps] installing ${need[*]}" >&2
apt-get update -qq
# A policy-rc.d that denies every start keeps the Prometheus server package from starting a daemon
# (only promtool is wanted); one that the machine already has is left as it is.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
