#!/usr/bin/env bash
# Local Apache Kafka (KRaft), Apache Cassandra and Redis for FiloPy development and tests.
#
#   scripts/services.sh up [kafka|cassandra|redis]    fetch jars if needed, start, wait until serving
#   scripts/services.sh down [kafka|cassandra|redis]  stop exactly the processes this script started
#   scripts/services.sh status                   say what runs
#   scripts/services.sh fetch                    only download the jars
#
# Jars come from Maven Central through the poms in scripts/maven/ and are cached under
# .services/cache/<service>-<pom hash>/ (git-ignored): a second `up` does not download again.
# Data, logs and pid files live under .services/ too. Everything listens on 127.0.0.1, or on
# FILOPY_SERVICES_HOST (one address of this host: what a cluster on several hosts dials; Kafka
# advertises it). `up` with no name starts Kafka and Cassandra; Redis (Debian's redis-server, the
# external store of Ray's control plane for head fault tolerance, docs/deployment.md) only by name.
#
# Environment: FILOPY_SERVICES_DIR (default <repo>/.services), FILOPY_SERVICES_CACHE (the jars,
# default $FILOPY_SERVICES_DIR/cache), FILOPY_SERVICES_HOST (127.0.0.1), FILOPY_PYTHON (default
# <repo>/.venv/bin/python, used for the readiness checks), FILOPY_KAFKA_PORT (9092),
# FILOPY_CASSANDRA_PORT (9042), FILOPY_REDIS_PORT (6380), FILOPY_KAFKA_HEAP (512m), FILOPY_CASSANDRA_HEAP (1G),
# FILOPY_SERVICE_TIMEOUT (seconds to wait for each service, 240).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SVC=${FILOPY_SERVICES_DIR:-$ROOT/.services}
CACHE=${FILOPY_SERVICES_CACHE:-$SVC/cache}
HOST=${FILOPY_SERVICES_HOST:-127.0.0.1}
REDIS_PORT=${FILOPY_REDIS_PORT:-6380}
PY=${FILOPY_PYTHON:-$ROOT/.venv/bin/python}
KAFKA_PORT=${FILOPY_KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=$((KAFKA_PORT + 1))
CASSANDRA_PORT=${FILOPY_CASSANDRA_PORT:-9042}
CASSANDRA_STORAGE_PORT=${FILOPY_CASSANDRA_STORAGE_PORT:-7000}
TIMEOUT=${FILOPY_SERVICE_TIMEOUT:-240}
CONF=$ROOT/scripts/conf

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] error: %s\n' "$*" >&2; exit 1; }

pidfile() { echo "$SVC/run/$1.pid"; }
logfile() { echo "$SVC/logs/$1.log"; }

# The pid in the pid file, if that process is alive and is the service we started.
running_pid() {
  local f pid
  f=$(pidfile "$1")
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE -- "(-D)?filopy.service=$1"; then
    echo "$pid"
  else
    return 1
  fi
}

# Download a service's jars once; the cache folder is keyed by the pom's hash.
fetch() {
  local svc=$1 pom hash dir
  pom=$ROOT/scripts/maven/$svc/pom.xml
  hash=$(sha256sum "$pom" | cut -c1-12)
  dir=$CACHE/$svc-$hash
  if [ ! -f "$dir/.complete" ]; then
    command -v mvn >/dev/null || die "mvn (Apache Maven) is needed to fetch $svc: apt-get install maven"
    log "fetching $svc jars from Maven Central into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    if ! mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$dir/lib" >"$dir/mvn.log" 2>&1; then
      die "mvn could not fetch $svc; see $dir/mvn.log"
    fi
    touch "$dir/.complete"
  fi
  echo "$dir"
}

check_java() {
  command -v java >/dev/null || die "java (17 or newer) is needed: apt-get install openjdk-17-jre-headless"
  local v
  v=$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')
  [ "${v%%.*}" -ge 17 ] 2>/dev/null || die "Java 17 or newer is needed, found $v"
}

port_free() { ! (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

wait_ready() {
  local svc=$1 addr=$2 pid=$3
  [ -x "$PY" ] || die "no Python with the project installed at $PY (run 'make venv' or set FILOPY_PYTHON)"
  if ! "$PY" "$ROOT/scripts/wait_ready.py" "$svc" "$addr" --timeout "$TIMEOUT" --pid "$pid"; then
    log "last lines of $(logfile "$svc"):"
    tail -n 25 "$(logfile "$svc")" >&2 || true
    die "$svc did not become ready; its log is $(logfile "$svc")"
  fi
}

start_kafka() {
  local pid dir data props cluster_id
  if pid=$(running_pid kafka); then log "kafka already running (pid $pid)"; return; fi
  port_free "$KAFKA_PORT" || die "port $KAFKA_PORT is taken by a process this script did not start"
  dir=$(fetch kafka)
  data=$SVC/data/kafka
  mkdir -p "$data" "$SVC/run" "$SVC/logs"
  props=$data/server.properties
  sed -e "s|@PORT@|$KAFKA_PORT|g" -e "s|@CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|g" \
      -e "s|@DATA@|$data|g" -e "s|@HOST@|$HOST|g" "$CONF/kafka-server.properties" >"$props"
  if [ ! -f "$data/log/meta.properties" ]; then
    cluster_id=$(java -cp "$dir/lib/*" kafka.tools.StorageTool random-uuid 2>>"$(logfile kafka)") \
      || die "Kafka's StorageTool failed; see $(logfile kafka)"
    java -cp "$dir/lib/*" -Dlog4j2.configurationFile="$CONF/kafka-log4j2.xml" \
      kafka.tools.StorageTool format -t "$cluster_id" -c "$props" >>"$(logfile kafka)" 2>&1 \
      || die "formatting Kafka storage failed; see $(logfile kafka)"
  fi
  log "starting kafka on $HOST:$KAFKA_PORT (log: $(logfile kafka))"
  nohup java -Dfilopy.service=kafka -Xms"${FILOPY_KAFKA_HEAP:-512m}" -Xmx"${FILOPY_KAFKA_HEAP:-512m}" \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$CONF/kafka-log4j2.xml" \
    -cp "$dir/lib/*" kafka.Kafka "$props" >>"$(logfile kafka)" 2>&1 </dev/null &
  echo $! >"$(pidfile kafka)"
  wait_ready kafka "$HOST:$KAFKA_PORT" "$!"
}

start_cassandra() {
  local pid dir data opts
  if pid=$(running_pid cassandra); then log "cassandra already running (pid $pid)"; return; fi
  port_free "$CASSANDRA_PORT" || die "port $CASSANDRA_PORT is taken by a process this script did not start"
  dir=$(fetch cassandra)
  data=$SVC/data/cassandra
  mkdir -p "$data" "$SVC/run" "$SVC/logs"
  sed -e "s|@PORT@|$CASSANDRA_PORT|g" -e "s|@STORAGE_PORT@|$CASSANDRA_STORAGE_PORT|g" \
      -e "s|@DATA@|$data|g" -e "s|@HOST@|$HOST|g" "$CONF/cassandra.yaml" >"$data/cassandra.yaml"
  mapfile -t opts < <(grep -vE '^\s*(#|$)' "$CONF/cassandra-jvm17.options")
  log "starting cassandra on $HOST:$CASSANDRA_PORT (log: $(logfile cassandra))"
  nohup java -Dfilopy.service=cassandra "${opts[@]}" \
    -Xms"${FILOPY_CASSANDRA_HEAP:-1G}" -Xmx"${FILOPY_CASSANDRA_HEAP:-1G}" \
    -Dcassandra.config="file://$data/cassandra.yaml" -Dcassandra.storagedir="$data" \
    -Dcassandra.logdir="$SVC/logs" -Dlogback.configurationFile="$CONF/cassandra-logback.xml" \
    -Dcassandra-foreground=yes \
    -cp "$dir/lib/*" org.apache.cassandra.service.CassandraDaemon >>"$(logfile cassandra)" 2>&1 </dev/null &
  echo $! >"$(pidfile cassandra)"
  wait_ready cassandra "$HOST:$CASSANDRA_PORT" "$!"
}

# Redis for Ray's GCS fault tolerance: append-only, so what Ray wrote survives a Redis restart.
start_redis() {
  local pid data
  if pid=$(running_pid redis); then log "redis already running (pid $pid)"; return; fi
  command -v redis-server >/dev/null || die "redis-server is needed: scripts/system-deps.sh (apt-get install redis-server)"
  port_free "$REDIS_PORT" || die "port $REDIS_PORT is taken by a process this script did not start"
  data=$SVC/data/redis
  mkdir -p "$data" "$SVC/run" "$SVC/logs"
  log "starting redis on $HOST:$REDIS_PORT (log: $(logfile redis))"
  # The marker argument lets running_pid recognise the process, as -Dfilopy.service does for Java.
  nohup redis-server --bind "$HOST" --port "$REDIS_PORT" --dir "$data" --appendonly yes \
    --save '' --protected-mode no --daemonize no --proc-title-template "{title} filopy.service=redis" \
    >>"$(logfile redis)" 2>&1 </dev/null &
  echo $! >"$(pidfile redis)"
  wait_ready redis "$HOST:$REDIS_PORT" "$!"
}

stop() {
  local svc=$1 pid
  if ! pid=$(running_pid "$svc"); then log "$svc not running"; rm -f "$(pidfile "$svc")"; return; fi
  log "stopping $svc (pid $pid)"
  kill "$pid"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then log "$svc did not stop in 30 s; killing it"; kill -9 "$pid"; fi
  rm -f "$(pidfile "$svc")"
}

status() {
  local svc pid
  for svc in kafka cassandra redis; do
    if pid=$(running_pid "$svc"); then log "$svc: running (pid $pid), log $(logfile "$svc")"
    else log "$svc: stopped"; fi
  done
}

services() { if [ $# -eq 0 ]; then echo kafka cassandra; else echo "$@"; fi; }

cmd=${1:-}
[ $# -gt 0 ] && shift
for s in "$@"; do case $s in kafka|cassandra|redis) ;; *) die "unknown service '$s' (kafka, cassandra or redis)";; esac; done
case $cmd in
  up)
    [ $# -eq 1 ] && [ "$1" = redis ] || check_java
    for s in $(services "$@"); do "start_$s"; done ;;
  down)  # with no name: every service this script started, Redis too
    for s in $(if [ $# -eq 0 ]; then echo kafka cassandra redis; else echo "$@"; fi); do stop "$s"; done ;;
  status) status ;;
  fetch)
    for s in $(services "$@"); do [ "$s" = redis ] || fetch "$s" >/dev/null; done; log "jars cached under $SVC/cache" ;;
  *) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
