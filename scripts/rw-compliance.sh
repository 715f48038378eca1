#!/usr/bin/env bash
# The Prometheus remote-write compliance suite (receiver tests) and a Prometheus 3 server (a
# remote write 2.0 sender), built from the Go module proxy at pinned versions.
#
#   scripts/rw-compliance.sh suite        build the receiver suite once; print the binary's path
#   scripts/rw-compliance.sh run URL ...  run the suite against a receiver URL (JSON events of
#                                         `go tool test2json` on stdout; extra args go to the
#                                         test binary, e.g. -test.run 'TestExemplars')
#   scripts/rw-compliance.sh prometheus   build Prometheus 3 once; print the binary's path
#
# The receiver suite is `github.com/prometheus/compliance/remotewrite/receiver` (its own Go
# module; the tests are `go test` files of package main, so the binary is `go test -c`'s). It
# sends hand-built remote write 1.0 and 2.0 requests to the URLs of a Prometheus config file's
# `remote_write:` entries and checks the status codes and X-Prometheus-Remote-Write-*-Written
# headers (it does not read anything back). `github.com/prometheus/compliance/remotewrite/sender`
# tests senders (it starts a receiver of its own and drives a sender binary), not receivers.
#
# Binaries are cached under .services/cache/<name>-<version>/ (git-ignored) beside the service
# jars: a second call builds nothing. Go's own caches (GOMODCACHE, GOCACHE) hold the modules and
# objects. Needs `go` (1.25 or newer) and the Go module proxy; a missing `go` fails loudly.
#
# Environment: FILOPY_SERVICES_DIR (default <repo>/.services).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SVC=${FILOPY_SERVICES_DIR:-$ROOT/.services}

SUITE_MODULE=github.com/prometheus/compliance/remotewrite/receiver
SUITE_VERSION=v0.0.0-20260806071727-67b8327a2e93
PROMETHEUS_MODULE=github.com/prometheus/prometheus
PROMETHEUS_VERSION=v0.316.0 # Prometheus 3.16.0 (the Go module's v0.3MM.P is Prometheus 3.MM.P)

log() { printf '[rw-compliance] %s\n' "$*" >&2; }
die() { printf '[rw-compliance] error: %s\n' "$*" >&2; exit 1; }

check_go() {
  command -v go >/dev/null || die "go (1.25 or newer) is needed to build the remote-write compliance suite: install Go from go.dev or Debian's golang-go"
  export GOTOOLCHAIN=local GOWORK=off GOFLAGS="-mod=mod -buildvcs=false"
}

# The module's source, read-only in Go's module cache.
module_dir() {
  local dir
  dir=$(go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') ||
    die "go mod download $1@$2 failed (is the Go module proxy reachable?)"
  [ -n "$dir" ] && [ -d "$dir" ] || die "go mod download $1@$2 gave no source directory"
  echo "$dir"
}

# A writable copy of a module's source in $2 (Go's module cache is read-only).
copy_module() {
  rm -rf "$2"
  mkdir -p "$2"
  cp -R "$1/." "$2/"
  chmod -R u+w "$2"
}

suite() {
  local out=$SVC/cache/rw-compliance-$SUITE_VERSION
  if [ ! -f "$out/.complete" ]; then
    check_go
    log "building $SUITE_MODULE@$SUITE_VERSION into $out"
    local src
    src=$(module_dir "$SUITE_MODULE" "$SUITE_VERSION")
    copy_module "$src" "$out/src"
    (cd "$out/src" && go test -c -o "$out/receiver.test" .) >"$out/build.log" 2>&1 ||
      die "building the compliance suite failed; see $out/build.log"
    touch "$out/.complete"
  fi
  echo "$out/receiver.test"
}

run() {
  [ $# -ge 1 ] || die "usage: $0 run URL [test binary args...]"
  local url=$1 bin
  shift
  bin=$(suite)
  check_go
  RUN_DIR=$(mktemp -d)
  trap 'rm -rf "$RUN_DIR"' EXIT
  printf 'remote_write:\n  - name: filopy\n    url: %s\n' "$url" >"$RUN_DIR/config.yml"
  cd "$RUN_DIR"
  PROMETHEUS_RW2_COMPLIANCE_CONFIG_FILE=$RUN_DIR/config.yml \
    go tool test2json -p receiver "$bin" -test.v=test2json "$@"
}

prometheus() {
  local out=$SVC/cache/prometheus-$PROMETHEUS_VERSION
  if [ ! -f "$out/.complete" ]; then
    check_go
    log "building $PROMETHEUS_MODULE@$PROMETHEUS_VERSION (cmd/prometheus) into $out"
    local src
    src=$(module_dir "$PROMETHEUS_MODULE" "$PROMETHEUS_VERSION")
    copy_module "$src" "$out/src"
    local release=${PROMETHEUS_VERSION#v0.3}  # 16.0 -> 3.16.0
    release=3.$((10#${release%%.*})).${release#*.}
    # remove_all_sd: no service-discovery plugins (the tests use static targets), which
    # leaves out most of the dependencies (cloud SDKs, Kubernetes) and most of the build time.
    (cd "$out/src" && go build -tags remove_all_sd -o "$out/prometheus" \
      -ldflags "-X github.com/prometheus/common/version.Version=$release" ./cmd/prometheus) \
      >"$out/build.log" 2>&1 ||
      die "building Prometheus failed; see $out/build.log"
    rm -rf "$out/src"
    touch "$out/.complete"
  fi
  echo "$out/prometheus"
}

case ${1:-suite} in
  suite) suite ;;
  run) shift; run "$@" ;;
  prometheus) prometheus ;;
  *) die "usage: $0 suite | run URL [args...] | prometheus" ;;
esac
