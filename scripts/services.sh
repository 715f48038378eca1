#!/usr/bin/env bash
# Local Apache Kafka (KRaft), Apache Cassandra and Redis for FiloPy development and tests.
#
#   scripts/services.sh up [kafka|cassandra|redis]    fetch jars if needed, start, wait until serving
#   scripts/services.sh down [kafka|cassandra|redis]  stop exactly the processes this script started
#   scripts/services.sh status                   say what runs
#   scripts/services.sh fetch                    only download the jars
#   scripts/services.sh up kafka-secure|cassandra-secure  the secured instances (see below)
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
# FILOPY_SERVICE_TIMEOUT (seconds to wait for each service, 240), FILOPY_SERVICES_JVM_OPTS (more
# options for each JVM it starts, split on spaces; `make test` gives -XX:TieredStopAtLevel=1).
#
# Secured instances, beside the plain ones (own ports, data and pid files; only by name):
# `kafka-secure` (FILOPY_KAFKA_SECURE_PORT, 9094: a SASL_SSL listener, SCRAM-SHA-256/512 user
# `filopy`) and `cassandra-secure` (FILOPY_CASSANDRA_SECURE_PORT, 9142: PasswordAuthenticator,
# role `filopy`, client TLS required). Their CA (ca.pem), server certificate and the generated
# passwords (kafka.password, cassandra.password) are made once with openssl under
# $FILOPY_SERVICES_DIR/secure/ (docs/security.md).
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
KAFKA_SECURE_PORT=${FILOPY_KAFKA_SECURE_PORT:-9094}
CASSANDRA_SECURE_PORT=${FILOPY_CASSANDRA_SECURE_PORT:-9142}
CASSANDRA_SECURE_STORAGE_PORT=${FILOPY_CASSANDRA_SECURE_STORAGE_PORT:-7100}
SECURE=$SVC/secure
ALL="kafka cassandra redis kafka-secure cassandra-secure"

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
  local svc=$1 pom hash dir fetching
  pom=$ROOT/scripts/maven/$svc/pom.xml
  hash=$(sha256sum "$pom" | cut -c1-12)
  dir=$CACHE/$svc-$hash
  mkdir -p "$CACHE"
  exec {fetching}>"$CACHE/$svc.lock"
  flock "$fetching"  # one download at a time: another `up` or `fetch` may be at it
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
  exec {fetching}>&-
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
  if ! "$PY" "$ROOT/scripts/wait_ready.py" "$svc" "$addr" --timeout "$TIMEOUT" --pid "$pid" \
      --secure-dir "$SECURE"; then
    log "last lines of $(logfile "$svc"):"
    tail -n 25 "$(logfile "$svc")" >&2 || true
    die "$svc did not become ready; its log is $(logfile "$svc")"
  fi
}

# Whether NAME runs already, once it serves: `up` may be called by several processes at once (the
# test workers, a start in the background), so one start of a service at a time (a lock per
# service, held until it serves; the service itself does not inherit it: {START_LOCK}>&-) and a
# second caller waits for the first one's start to finish.
already_up() {
  local name=$1 addr=$2 pid
  mkdir -p "$SVC/run"
  exec {START_LOCK}>"$SVC/run/$name.lock"
  flock "$START_LOCK"
  if pid=$(running_pid "$name"); then
    wait_ready "$name" "$addr" "$pid"
    log "$name already running (pid $pid)"
    return 0
  fi
  return 1
}

# The CA, the servers' certificate (one PKCS12 keystore, SAN 127.0.0.1, localhost and $HOST) and
# the passwords of the secured instances: made once, readable by this user only.
secure_material() {
  if [ -f "$SECURE/.complete" ]; then
    [ "$(cat "$SECURE/.complete")" = "$HOST" ] \
      || die "$SECURE was made for host $(cat "$SECURE/.complete"), not $HOST: remove it and $SVC/data/*-secure"
    return
  fi
  command -v openssl >/dev/null || die "openssl is needed for the secured services: apt-get install openssl"
  log "making a CA, a server certificate and passwords in $SECURE"
  rm -rf "$SECURE"
  mkdir -p "$SECURE" "$SVC/logs"
  chmod 700 "$SECURE"
  if ! (
    cd "$SECURE" && umask 077
    for f in keystore kafka kafka-admin cassandra; do openssl rand -hex 16 >"$f.password"; done
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.pem \
      -subj "/CN=FiloPy development CA" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign"
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=$HOST"
    printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost,$( [[ $HOST =~ ^[0-9.]+$ ]] && echo IP || echo DNS ):$HOST" \
      "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" "authorityKeyIdentifier=keyid,issuer" >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
      -extfile server.ext -out server.pem
    openssl pkcs12 -export -in server.pem -inkey server.key -certfile ca.pem -name server \
      -out server.p12 -passout "file:keystore.password"
    chmod 644 ca.pem
  ) >>"$SVC/logs/secure.log" 2>&1; then
    die "making the certificates failed; see $SVC/logs/secure.log"
  fi
  echo "$HOST" >"$SECURE/.complete"
}

# Render a config template: the placeholders every service shares, then the secured ones.
render() {
  local port=$1 extra=$2 data=$3; shift 3
  sed -e "s|@PORT@|$port|g" -e "s|@CONTROLLER_PORT@|$((port + 1))|g" -e "s|@DATA@|$data|g" \
      -e "s|@HOST@|$HOST|g" -e "s|@STORAGE_PORT@|$extra|g" -e "s|@SECURE@|$SECURE|g" \
      -e "s|@KEYSTORE_PASSWORD@|$(cat "$SECURE/keystore.password" 2>/dev/null)|g" \
      -e "s|@ADMIN_PASSWORD@|$(cat "$SECURE/kafka-admin.password" 2>/dev/null)|g" "$@"
}

start_kafka() { start_kafka_as kafka "$KAFKA_PORT"; }

start_kafka-secure() {
  secure_material
  local p
  p=$(cat "$SECURE/kafka.password")
  start_kafka_as kafka-secure "$KAFKA_SECURE_PORT" "$CONF/kafka-secure.properties" \
    --add-scram "SCRAM-SHA-512=[name=admin,password=$(cat "$SECURE/kafka-admin.password")]" \
    --add-scram "SCRAM-SHA-512=[name=filopy,password=$p]" \
    --add-scram "SCRAM-SHA-256=[name=filopy,password=$p]"
}

# start_kafka_as NAME PORT [FRAGMENT [FORMAT ARGS...]]: the fragment is appended to the plain
# properties (later keys win); the format arguments go to the storage format (SCRAM users).
start_kafka_as() {
  local name=$1 port=$2 fragment=${3:-} pid dir data props cluster_id
  shift $(($# < 3 ? $# : 3))
  if already_up "$name" "$HOST:$port"; then return; fi
  port_free "$port" || die "port $port is taken by a process this script did not start"
  dir=$(fetch kafka)
  data=$SVC/data/$name
  mkdir -p "$data" "$SVC/run" "$SVC/logs"
  props=$data/server.properties
  (umask 077 && render "$port" "" "$data" "$CONF/kafka-server.properties" ${fragment:+"$fragment"} >"$props")
  if [ ! -f "$data/log/meta.properties" ]; then
    cluster_id=$(java -cp "$dir/lib/*" kafka.tools.StorageTool random-uuid 2>>"$(logfile "$name")") \
      || die "Kafka's StorageTool failed; see $(logfile "$name")"
    java -cp "$dir/lib/*" -Dlog4j2.configurationFile="$CONF/kafka-log4j2.xml" \
      kafka.tools.StorageTool format -t "$cluster_id" -c "$props" "$@" >>"$(logfile "$name")" 2>&1 \
      || die "formatting Kafka storage failed; see $(logfile "$name")"
  fi
  log "starting $name on $HOST:$port (log: $(logfile "$name"))"
  # shellcheck disable=SC2086  # several options, split on spaces
  nohup java -Dfilopy.service="$name" ${FILOPY_SERVICES_JVM_OPTS:-} -Xms"${FILOPY_KAFKA_HEAP:-512m}" -Xmx"${FILOPY_KAFKA_HEAP:-512m}" \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$CONF/kafka-log4j2.xml" \
    -cp "$dir/lib/*" kafka.Kafka "$props" >>"$(logfile "$name")" 2>&1 </dev/null {START_LOCK}>&- &
  echo $! >"$(pidfile "$name")"
  wait_ready "$name" "$HOST:$port" "$!"
}

start_cassandra() { start_cassandra_as cassandra "$CASSANDRA_PORT" "$CASSANDRA_STORAGE_PORT"; }

start_cassandra-secure() {
  secure_material
  start_cassandra_as cassandra-secure "$CASSANDRA_SECURE_PORT" "$CASSANDRA_SECURE_STORAGE_PORT" \
    "$CONF/cassandra-secure.yaml"
}

# start_cassandra_as NAME PORT STORAGE_PORT [FRAGMENT]: the fragment is appended to the yaml.
start_cassandra_as() {
  local name=$1 port=$2 storage=$3 fragment=${4:-} pid dir data opts
  if already_up "$name" "$HOST:$port"; then return; fi
  port_free "$port" || die "port $port is taken by a process this script did not start"
  dir=$(fetch cassandra)
  data=$SVC/data/$name
  mkdir -p "$data" "$SVC/run" "$SVC/logs"
  (umask 077 && render "$port" "$storage" "$data" "$CONF/cassandra.yaml" ${fragment:+"$fragment"} >"$data/cassandra.yaml")
  mapfile -t opts < <(grep -vE '^\s*(#|$)' "$CONF/cassandra-jvm17.options")
  log "starting $name on $HOST:$port (log: $(logfile "$name"))"
  # shellcheck disable=SC2086
  nohup java -Dfilopy.service="$name" "${opts[@]}" ${FILOPY_SERVICES_JVM_OPTS:-} \
    -Xms"${FILOPY_CASSANDRA_HEAP:-1G}" -Xmx"${FILOPY_CASSANDRA_HEAP:-1G}" \
    -Dcassandra.config="file://$data/cassandra.yaml" -Dcassandra.storagedir="$data" \
    -Dcassandra.logdir="$SVC/logs" -Dlogback.configurationFile="$CONF/cassandra-logback.xml" \
    -Dcassandra-foreground=yes \
    -cp "$dir/lib/*" org.apache.cassandra.service.CassandraDaemon >>"$(logfile "$name")" 2>&1 </dev/null {START_LOCK}>&- &
  echo $! >"$(pidfile "$name")"
  wait_ready "$name" "$HOST:$port" "$!"
}

# Redis for Ray's GCS fault tolerance: append-only, so what Ray wrote survives a Redis restart.
start_redis() {
  local pid data
  if already_up redis "$HOST:$REDIS_PORT"; then return; fi
  command -v redis-server >/dev/null || die "redis-server is needed: scripts/system-deps.sh (apt-get install redis-server)"
  port_free "$REDIS_PORT" || die "port $REDIS_PORT is taken by a process this script did not start"
  data=$SVC/data/redis
  mkdir -p "$data" "$SVC/run" "$SVC/logs"
  log "starting redis on $HOST:$REDIS_PORT (log: $(logfile redis))"
  # The marker argument lets running_pid recognise the process, as -Dfilopy.service does for Java.
  nohup redis-server --bind "$HOST" --port "$REDIS_PORT" --dir "$data" --appendonly yes \
    --save '' --protected-mode no --daemonize no --proc-title-template "{title} filopy.service=redis" \
    >>"$(logfile redis)" 2>&1 </dev/null {START_LOCK}>&- &
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
  for svc in $ALL; do
    if pid=$(running_pid "$svc"); then log "$svc: running (pid $pid), log $(logfile "$svc")"
    else log "$svc: stopped"; fi
  done
}

services() { if [ $# -eq 0 ]; then echo kafka cassandra; else echo "$@"; fi; }

cmd=${1:-}
[ $# -gt 0 ] && shift
for s in "$@"; do case $s in kafka|cassandra|redis|kafka-secure|cassandra-secure) ;; *) die "unknown service '$s' (kafka, cassandra, redis, kafka-secure or cassandra-secure)";; esac; done
case $cmd in
  up)
    [ $# -eq 1 ] && [ "$1" = redis ] || check_java
    # Each start in a subshell, so its lock is let go once the service serves.
    for s in $(services "$@"); do ( "start_$s" ); done ;;
  down)  # with no name: every service this script started, Redis and the secured ones too
    for s in $(if [ $# -eq 0 ]; then echo "$ALL"; else echo "$@"; fi); do stop "$s"; done ;;
  status) status ;;
  fetch)
    for s in $(services "$@"); do [ "$s" = redis ] || fetch "${s%-secure}" >/dev/null; done; log "jars cached under $SVC/cache" ;;
  *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
