"""The production backend: MetaStore and ColumnStore on Apache Cassandra (cassandra-driver).

Fencing. A shard's ownership epoch and its flush groups' checkpoints live in one partition
(`shard_state`, partition (dataset, shard), clustering flush_group, `epoch` a static column). The
epoch claim (`... SET epoch = e+1 IF epoch = e`) and the checkpoint commit
(`... SET checkpoint = o WHERE flush_group = g IF epoch = e AND checkpoint <= o`) are lightweight
transactions on that same partition, so Paxos orders them: once a claim has been accepted, no
commit carrying an older epoch can apply. A failed condition is answered with the row's current
values, which tell a stale epoch (StaleEpochError) from a lower offset (a no-op: checkpoints never
go backwards). Timeouts and unreachable replicas are StoreTimeout / StoreUnavailable instead.

Data. Part keys: partition (dataset, shard), one row per series. Chunks: partition
(dataset, shard, part_key), clustering start_time (the chunk id), so a time-range read is one slice
`start_time in [start - max_chunk_span_ms, end]` per series, and rewriting a chunk overwrites the
same row (idempotent). Writes of many series go out concurrently (bounded in flight), rows of one
partition together in UNLOGGED batches, which Cassandra applies as one mutation.

Retention. Chunks and part keys are written `USING TTL`: a row expires `retention` after its last
sample, so Cassandra frees it with no sweep; what is already past retention is not written. The
chunks table uses time-window compaction: rows written together expire together, so whole
SSTables are dropped instead of compacted. A change of retention applies to reads at once
(they clamp to `now - retention`) and to rows written afterwards; rows already written keep the
TTL they were written with (a shorter retention frees their space at their old expiry, a
longer one does not bring back what expired). Bytes stored are counters per (dataset, day),
added at write and forgotten by the sweep once the day is past retention.
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from cassandra import (
    ConsistencyLevel,
    DriverException,
    OperationTimedOut,
    ReadTimeout,
    RequestExecutionException,
    RequestValidationException,
    Unavailable,
    WriteTimeout,
    WriteType,
)
from cassandra.auth import AuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.concurrent import execute_concurrent
from cassandra.connection import ConnectionException
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.query import (
    BatchStatement,
    BatchType,
    PreparedStatement,
    Statement,
    dict_factory,
    tuple_factory,
)

from core.auth import Token
from core.dataset import Dataset
from core.errors import Unsupported
from store.api import (
    DEFAULT_MAX_CHUNK_SPAN_MS,
    ChunkRecord,
    ColumnStore,
    DatasetConflict,
    HoldsShared,
    MetaStore,
    OwnershipChange,
    PartKeyRecord,
    ShardEpoch,
    SharedHandle,
    StaleEpochError,
    StoredBytes,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    SweepResult,
    TokenConflict,
)

_KEYSPACE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
_CAS_ATTEMPTS = 16  # a claim or commit retried after losing a race to a concurrent LWT
_BATCH_BYTES = 32 * 1024  # below Cassandra's batch_size_fail_threshold (50 KiB by default)
_BATCH_ROWS = 100
_SNAPSHOT_PAGE = 256 * 1024  # bytes of an open-buffer snapshot per row
_LWT, _DATA = "filopy-lwt", "filopy-data"
# Cassandra refuses TTLs expiring past 2038-01-19 (CASSANDRA-14092): history is kept 10 years
# at most there.
_MAX_TTL_S = 10 * 365 * 86_400
_BYTES_DAY_MS = 86_400_000  # the bytes counters' bucket, also the compaction window
_RETENTION_CACHE_S = 5.0  # how soon another process's retention change reaches this one's reads
_TWCS = (
    "{'class': 'TimeWindowCompactionStrategy', 'compaction_window_unit': 'DAYS', "
    "'compaction_window_size': '1'}"
)

TABLES = (
    """CREATE TABLE IF NOT EXISTS {ks}.datasets (
        name text PRIMARY KEY,
        definition text)""",
    """CREATE TABLE IF NOT EXISTS {ks}.shard_state (
        dataset text,
        shard int,
        flush_group int,
        epoch bigint STATIC,
        owner text STATIC,
        checkpoint bigint,
        PRIMARY KEY ((dataset, shard), flush_group))""",
    """CREATE TABLE IF NOT EXISTS {ks}.part_keys (
        dataset text,
        shard int,
        part_key text,
        start_time bigint,
        end_time bigint,
        PRIMARY KEY ((dataset, shard), part_key))""",
    """CREATE TABLE IF NOT EXISTS {ks}.chunks (
        dataset text,
        shard int,
        part_key text,
        start_time bigint,
        end_time bigint,
        num_samples int,
        data blob,
        PRIMARY KEY ((dataset, shard, part_key), start_time))
        WITH CLUSTERING ORDER BY (start_time ASC)
        AND compaction = {twcs}""",
    """CREATE TABLE IF NOT EXISTS {ks}.retention (
        dataset text PRIMARY KEY,
        retention_ms bigint)""",
    """CREATE TABLE IF NOT EXISTS {ks}.chunk_bytes (
        dataset text,
        day bigint,
        bytes counter,
        chunks counter,
        PRIMARY KEY ((dataset), day))""",
    # A snapshot is split into pages (rows) so no mutation grows past Cassandra's limits; each
    # page says how many there are, so a torn write is seen as incomplete, never read as whole.
    """CREATE TABLE IF NOT EXISTS {ks}.open_snapshots (
        dataset text,
        shard int,
        flush_group int,
        offset bigint,
        epoch bigint,
        page int,
        pages int,
        data blob,
        PRIMARY KEY ((dataset, shard), flush_group, offset, epoch, page))""",
    """CREATE TABLE IF NOT EXISTS {ks}.ownership_history (
        dataset text,
        at_ms bigint,
        shard int,
        to_node text,
        from_node text,
        reason text,
        epoch bigint,
        replayed_offsets bigint,
        PRIMARY KEY ((dataset), at_ms, shard, to_node))
        WITH CLUSTERING ORDER BY (at_ms DESC, shard DESC, to_node ASC)""",
    # One partition per token: few rows, read whole by every server that checks requests.
    # Empty collections read back as null: no datasets is every dataset.
    """CREATE TABLE IF NOT EXISTS {ks}.tokens (
        id text PRIMARY KEY,
        name text,
        scopes set<text>,
        secret_sha256 text,
        created_ms bigint,
        datasets list<text>,
        tenant text,
        revoked_ms bigint)""",
)

_TOKEN_COLUMNS = "id, name, scopes, secret_sha256, created_ms, datasets, tenant, revoked_ms"


def _token(row: Sequence[Any]) -> Token:
    tid, name, scopes, digest, created, datasets, tenant, revoked = row
    return Token(
        id=tid,
        name=name,
        scopes=frozenset(scopes or ()),
        secret_sha256=digest,
        created_ms=created,
        datasets=tuple(datasets or ()),
        tenant=tenant,
        revoked_ms=revoked,
    )


def _max_part_key_bytes(name: str) -> int:
    """Cassandra keys hold at most 65535 bytes; the chunks' key (dataset, shard, part_key) frames
    each component in 3 bytes. Datasets' label limits keep series keys well below this."""
    return 0xFFFF - 3 * 3 - len(name.encode("utf-8")) - 4


def _check_part_keys(name: str, keys: Iterable[str]) -> None:
    """A clear error for a key Cassandra cannot hold (the driver would raise struct.error)."""
    limit = _max_part_key_bytes(name)
    for key in keys:
        if len(key) * 4 > limit and len(key.encode("utf-8")) > limit:
            raise ValueError(
                f"part key of {len(key.encode('utf-8'))} bytes exceeds the {limit} bytes "
                f"Cassandra can key for dataset {name!r} (limits.max_series_key_bytes): "
                f"{key[:100]}..."
            )


def _cql_map(m: Mapping[str, str]) -> str:
    def q(s: str) -> str:
        return "'" + str(s).replace("'", "''") + "'"

    return "{" + ", ".join(f"{q(k)}: {q(v)}" for k, v in m.items()) + "}"


@contextmanager
def _translate(what: str) -> Iterator[None]:
    """Driver exceptions as StoreErrors: unavailable and timeouts apart from real failures."""
    try:
        yield
    except NoHostAvailable as e:
        raise StoreUnavailable(f"{what}: no Cassandra host available: {e}") from e
    except WriteTimeout as e:
        cas = getattr(e, "write_type", None) == WriteType.CAS
        unknown = " (a lightweight transaction: its outcome is unknown)" if cas else ""
        raise StoreTimeout(f"{what}: Cassandra write timed out{unknown}: {e}") from e
    except (ReadTimeout, OperationTimedOut) as e:
        raise StoreTimeout(f"{what}: Cassandra request timed out: {e}") from e
    except Unavailable as e:
        raise StoreUnavailable(f"{what}: not enough Cassandra replicas alive: {e}") from e
    except ConnectionException as e:  # a connection dropped mid-request (node stopping, network)
        raise StoreUnavailable(f"{what}: Cassandra connection lost: {e}") from e
    except (RequestExecutionException, RequestValidationException, DriverException) as e:
        raise StoreError(f"{what}: {type(e).__name__}: {e}") from e


class CassandraConnection(SharedHandle):
    """A cluster connection and its prepared statements, shared by both Cassandra stores.

    Creates the keyspace and tables if missing. Reference-counted: closed with its last store."""

    def __init__(
        self,
        contact_points: Sequence[str],
        port: int = 9042,
        keyspace: str = "filopy",
        replication: Mapping[str, str] | None = None,
        consistency: str = "LOCAL_QUORUM",
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 10.0,
        *,
        data_consistency: str | None = None,
        local_dc: str | None = None,
        auth_provider: AuthProvider | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if not _KEYSPACE_RE.match(keyspace):
            raise ValueError(f"invalid Cassandra keyspace name {keyspace!r}")
        self.keyspace = keyspace
        self.retention_cache: dict[str, tuple[float, int | None]] = {}  # dataset -> (when, ms)
        self.where = f"Cassandra at {', '.join(contact_points)} (port {port})"
        levels = ConsistencyLevel.name_to_value
        if consistency not in levels or (data_consistency or consistency) not in levels:
            raise ValueError(f"unknown consistency level {consistency!r} / {data_consistency!r}")
        serial = (
            ConsistencyLevel.LOCAL_SERIAL
            if consistency.startswith("LOCAL_")
            else ConsistencyLevel.SERIAL
        )
        self.serial = serial

        def profile(level: str, rows: Any) -> ExecutionProfile:
            return ExecutionProfile(
                load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=local_dc)),
                consistency_level=levels[level],
                serial_consistency_level=serial,
                request_timeout=request_timeout_s,
                row_factory=rows,
            )

        self.cluster = Cluster(
            list(contact_points),
            port=port,
            connect_timeout=connect_timeout_s,
            control_connection_timeout=connect_timeout_s,
            # The driver's default backs off to 10 minutes between tries to reach a host it
            # lost: a store cut off for a while would stay away that long after the network
            # healed. A try is one TCP connect, so try at least every 10 s.
            reconnection_policy=ExponentialReconnectionPolicy(base_delay=0.5, max_delay=10.0),
            auth_provider=auth_provider,  # the password and TLS of [cassandra], if set
            ssl_context=ssl_context,
            execution_profiles={
                EXEC_PROFILE_DEFAULT: profile(consistency, tuple_factory),
                _LWT: profile(consistency, dict_factory),
                _DATA: profile(data_consistency or consistency, tuple_factory),
            },
        )
        super().__init__()
        try:
            self.session = self.cluster.connect()
        except Exception as e:
            self.cluster.shutdown()
            raise StoreUnavailable(
                f"cannot connect to {self.where} within {connect_timeout_s} s: {e}"
            ) from e
        try:
            self._create_schema(
                replication or {"class": "SimpleStrategy", "replication_factor": "1"},
                max(request_timeout_s, 30.0),
            )
        except BaseException:
            self.cluster.shutdown()
            raise

    def _create_schema(self, replication: Mapping[str, str], timeout: float) -> None:
        ks = self.keyspace
        with _translate(f"creating keyspace {ks} on {self.where}"):
            self.session.execute(
                f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {_cql_map(replication)}",
                timeout=timeout,
            )
            for ddl in TABLES:
                self.session.execute(ddl.format(ks=ks, twcs=_TWCS), timeout=timeout)
            # A keyspace from before retention: its chunks table gets time-window compaction.
            row = self.session.execute(
                "SELECT compaction FROM system_schema.tables "
                "WHERE keyspace_name = %s AND table_name = 'chunks'",
                (ks,),
                timeout=timeout,
            ).one()
            if row is not None and "TimeWindow" not in str(row[0].get("class", "")):
                self.session.execute(
                    f"ALTER TABLE {ks}.chunks WITH compaction = {_TWCS}", timeout=timeout
                )

    def prepare(self, cql: str, *, serial_read: bool = False) -> PreparedStatement:
        with _translate(f"preparing a statement on {self.where}"):
            stmt = self.session.prepare(cql.format(ks=self.keyspace))
        if serial_read:
            stmt.consistency_level = self.serial  # linearisable: sees every committed LWT
        return stmt

    def execute(
        self,
        stmt: Statement | PreparedStatement,
        params: Sequence[Any] = (),
        profile: str = EXEC_PROFILE_DEFAULT,
    ) -> Any:
        with _translate(f"request to {self.where}"):
            return self.session.execute(stmt, params, execution_profile=profile)

    def execute_many(
        self,
        items: Iterable[tuple[Statement | PreparedStatement, Sequence[Any] | None]],
        concurrency: int,
    ) -> list[Any]:
        """Run statements with at most `concurrency` in flight; results in order."""
        with _translate(f"concurrent requests to {self.where}"):
            return [
                r.result_or_exc
                for r in execute_concurrent(
                    self.session,
                    items,
                    concurrency=concurrency,
                    raise_on_first_error=True,
                    execution_profile=_DATA,
                )
            ]

    def _shut_down(self) -> None:
        self.cluster.shutdown()


class _UsesConnection(HoldsShared):
    def __init__(self, conn: CassandraConnection) -> None:
        super().__init__(conn)
        self._conn = conn


class CassandraMetaStore(_UsesConnection, MetaStore):
    def __init__(self, conn: CassandraConnection) -> None:
        super().__init__(conn)
        try:
            self._prepare(conn.prepare)
        except BaseException:
            self.close()
            raise

    def _prepare(self, p: Any) -> None:
        self._insert_dataset = p(
            "INSERT INTO {ks}.datasets (name, definition) VALUES (?, ?) IF NOT EXISTS"
        )
        self._select_dataset = p("SELECT definition FROM {ks}.datasets WHERE name = ?")
        self._select_datasets = p("SELECT definition FROM {ks}.datasets")
        self._delete_dataset_stmt = p("DELETE FROM {ks}.datasets WHERE name = ? IF EXISTS")
        self._claim_first = p(
            "UPDATE {ks}.shard_state SET epoch = ?, owner = ? WHERE dataset = ? AND shard = ? "
            "IF epoch = null"
        )
        self._claim_next = p(
            "UPDATE {ks}.shard_state SET epoch = ?, owner = ? WHERE dataset = ? AND shard = ? "
            "IF epoch = ?"
        )
        self._select_epoch = p(
            "SELECT epoch, owner FROM {ks}.shard_state WHERE dataset = ? AND shard = ? LIMIT 1",
            serial_read=True,
        )
        self._commit_advance = p(
            "UPDATE {ks}.shard_state SET checkpoint = ? "
            "WHERE dataset = ? AND shard = ? AND flush_group = ? IF epoch = ? AND checkpoint <= ?"
        )
        self._commit_first = p(
            "UPDATE {ks}.shard_state SET checkpoint = ? "
            "WHERE dataset = ? AND shard = ? AND flush_group = ? IF epoch = ? AND checkpoint = null"
        )
        self._commit_set = p(
            "UPDATE {ks}.shard_state SET checkpoint = ? "
            "WHERE dataset = ? AND shard = ? AND flush_group = ? IF epoch = ?"
        )
        self._select_checkpoints = p(
            "SELECT flush_group, checkpoint FROM {ks}.shard_state WHERE dataset = ? AND shard = ?",
            serial_read=True,
        )
        self._insert_history = p(
            "INSERT INTO {ks}.ownership_history (dataset, at_ms, shard, to_node, from_node, "
            "reason, epoch, replayed_offsets) VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
        )
        self._select_history = p(
            "SELECT dataset, shard, at_ms, from_node, to_node, reason, epoch, replayed_offsets "
            "FROM {ks}.ownership_history WHERE dataset = ?"
        )
        # Tokens as datasets: written by lightweight transactions (a token is created once and
        # revoked once, whichever servers race), read at the metadata consistency, which sees
        # every committed one.
        self._insert_token = p(
            f"INSERT INTO {{ks}}.tokens ({_TOKEN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "IF NOT EXISTS"
        )
        self._insert_retention = p(
            "INSERT INTO {ks}.retention (dataset, retention_ms) VALUES (?, ?)"
        )
        self._delete_retention = p("DELETE FROM {ks}.retention WHERE dataset = ?")
        self._select_retention = p(_SELECT_RETENTION)
        self._select_token = p(f"SELECT {_TOKEN_COLUMNS} FROM {{ks}}.tokens WHERE id = ?")
        self._select_tokens = p(f"SELECT {_TOKEN_COLUMNS} FROM {{ks}}.tokens")
        # `created_ms != null`: on a missing row `revoked_ms = null` holds, and would create one.
        self._revoke_token_stmt = p(
            "UPDATE {ks}.tokens SET revoked_ms = ? WHERE id = ? "
            "IF created_ms != null AND revoked_ms = null"
        )

    def _record_ownership(self, changes: list[OwnershipChange], retention_ms: int) -> None:
        now = int(time.time() * 1000)
        for ch in changes:  # few at a time (a rebalance round): plain writes, in order
            ttl = (ch.at_ms + retention_ms - now) // 1000  # kept for retention_ms after at_ms
            if ttl < 1:
                continue
            ttl = min(ttl, _MAX_TTL_S)
            self._conn.execute(
                self._insert_history,
                (
                    ch.dataset,
                    ch.at_ms,
                    ch.shard,
                    ch.to_node or "",
                    ch.from_node or "",
                    ch.reason,
                    ch.epoch,
                    ch.replayed_offsets,
                    ttl,
                ),
            )

    def _ownership_history(self, name: str, shard: int | None, limit: int) -> list[OwnershipChange]:
        out: list[OwnershipChange] = []
        # The partition is the dataset, newest first; one shard's rows are filtered out of it.
        for row in self._conn.execute(self._select_history, (name,)):
            d, sh, at, fr, to, why, ep, rep = row
            if shard is not None and sh != shard:
                continue
            out.append(OwnershipChange(d, sh, at, fr or None, to or None, why, ep, rep))
            if len(out) >= limit:
                break
        return out

    def _set_retention(self, name: str, retention_ms: int | None) -> None:
        if retention_ms is None:
            self._conn.execute(self._delete_retention, (name,))
        else:
            self._conn.execute(self._insert_retention, (name, retention_ms))
        self._conn.retention_cache.pop(name, None)

    def _get_retention(self, name: str) -> int | None:
        return _read_retention(self._conn, self._select_retention, name)

    def _set_size_limit(self, name: str, max_bytes: int | None) -> None:
        if max_bytes is not None:
            raise Unsupported(
                "a size limit per dataset is not enforced on Cassandra, whose rows expire by "
                "TTL: give the dataset a retention instead (docs/storage.md)"
            )

    def _get_size_limit(self, name: str) -> int | None:
        return None

    def _lwt(self, stmt: PreparedStatement, params: Sequence[Any]) -> dict[str, Any]:
        """Run a lightweight transaction; its row: `[applied]` and, if not, current values."""
        row = self._conn.execute(stmt, params, profile=_LWT).one()
        if row is None or "[applied]" not in row:
            raise StoreError(f"unexpected answer to a lightweight transaction: {row!r}")
        return row

    def _create_dataset(self, dataset: Dataset) -> bool:
        row = self._lwt(self._insert_dataset, (dataset.name, dataset.to_json()))
        if row["[applied]"]:
            return True
        existing = Dataset.from_json(row["definition"])
        if existing != dataset:
            raise DatasetConflict(existing, dataset)
        return False

    def _get_dataset(self, name: str) -> Dataset | None:
        row = self._conn.execute(self._select_dataset, (name,)).one()
        return None if row is None else Dataset.from_json(row[0])

    def _list_datasets(self) -> list[Dataset]:
        return [Dataset.from_json(r[0]) for r in self._conn.execute(self._select_datasets)]

    def _delete_dataset(self, name: str) -> bool:
        return bool(self._lwt(self._delete_dataset_stmt, (name,))["[applied]"])

    def _put_token(self, token: Token) -> None:
        row = self._lwt(
            self._insert_token,
            (
                token.id,
                token.name,
                set(token.scopes),
                token.secret_sha256,
                token.created_ms,
                list(token.datasets),
                token.tenant,
                token.revoked_ms,
            ),
        )
        if not row["[applied]"]:
            raise TokenConflict(f"a token with id {token.id!r} exists already")

    def _get_token(self, token_id: str) -> Token | None:
        row = self._conn.execute(self._select_token, (token_id,)).one()
        return None if row is None else _token(row)

    def _list_tokens(self) -> list[Token]:
        rows = self._conn.execute(self._select_tokens)
        with _translate(f"listing tokens on {self._conn.where}"):
            return [_token(r) for r in rows]  # iterating fetches further pages

    def _revoke_token(self, token_id: str, now_ms: int) -> bool:
        return bool(self._lwt(self._revoke_token_stmt, (now_ms, token_id))["[applied]"])

    def _claim_epoch(self, name: str, shard: int, owner: str) -> int:
        current: int | None = None  # optimistic: most claims are of a shard's first epoch
        for _ in range(_CAS_ATTEMPTS):
            if current is None:
                new, row = 1, self._lwt(self._claim_first, (1, owner, name, shard))
            else:
                new = current + 1
                row = self._lwt(self._claim_next, (new, owner, name, shard, current))
            if row["[applied]"]:
                return new
            current = row.get("epoch")
        raise StoreError(
            f"could not claim an epoch for shard {shard} of {name!r}: "
            f"{_CAS_ATTEMPTS} concurrent claims won the race"
        )

    def _current_epoch(self, name: str, shard: int) -> ShardEpoch:
        row = self._conn.execute(self._select_epoch, (name, shard)).one()
        if row is None or row[0] is None:
            return ShardEpoch(0, "")
        return ShardEpoch(row[0], row[1] or "")

    def _commit_checkpoint(self, name: str, shard: int, group: int, offset: int, epoch: int) -> int:
        key = (name, shard, group)
        for _ in range(_CAS_ATTEMPTS):
            row = self._lwt(self._commit_advance, (offset, *key, epoch, offset))
            if row["[applied]"]:
                return offset
            current = row.get("epoch") or 0
            if current != epoch:
                raise StaleEpochError(name, shard, epoch, current)
            stored = row.get("checkpoint")
            if stored is not None:
                return stored  # stored > offset: checkpoints never go backwards
            # The group's first checkpoint: `checkpoint <= ?` is false on null.
            row = self._lwt(self._commit_first, (offset, *key, epoch))
            if row["[applied]"]:
                return offset
            if (row.get("epoch") or 0) != epoch:
                raise StaleEpochError(name, shard, epoch, row.get("epoch") or 0)
        raise StoreError(f"checkpoint commit for shard {shard} of {name!r} kept losing races")

    def _set_checkpoint(self, name: str, shard: int, group: int, value: int, epoch: int) -> None:
        row = self._lwt(self._commit_set, (value, name, shard, group, epoch))
        if not row["[applied]"]:
            raise StaleEpochError(name, shard, epoch, row.get("epoch") or 0)

    def _read_checkpoints(self, name: str, shard: int) -> dict[int, int]:
        rows = self._conn.execute(self._select_checkpoints, (name, shard))
        # A partition with only the static epoch yields one row with a null flush_group.
        return {g: c for g, c in rows if g is not None and c is not None}


_SELECT_RETENTION = "SELECT retention_ms FROM {ks}.retention WHERE dataset = ?"


def _read_retention(conn: CassandraConnection, stmt: PreparedStatement, name: str) -> int | None:
    row = conn.execute(stmt, (name,)).one()
    return None if row is None or row[0] is None else int(row[0])


def _ttl_s(end_time: int, retention_ms: int, now_ms: int) -> int:
    """Seconds until `end_time + retention_ms` (rounded up, so the row outlives the read
    boundary rather than leave before it); 0, Cassandra's "never", when kept forever."""
    if retention_ms <= 0:
        return 0
    return max(1, min(_MAX_TTL_S, -(-(end_time + retention_ms - now_ms) // 1000)))


class CassandraColumnStore(_UsesConnection, ColumnStore):
    def __init__(
        self,
        conn: CassandraConnection,
        max_chunk_span_ms: int = DEFAULT_MAX_CHUNK_SPAN_MS,
        *,
        write_concurrency: int = 64,
        read_concurrency: int = 64,
        default_retention_ms: int = 0,
    ) -> None:
        ColumnStore.__init__(self, max_chunk_span_ms, default_retention_ms)
        _UsesConnection.__init__(self, conn)
        self.write_concurrency = write_concurrency
        self.read_concurrency = read_concurrency
        try:
            self._prepare(conn.prepare)
        except BaseException:
            self.close()
            raise

    def _prepare(self, p: Any) -> None:
        self._insert_part_key = p(
            "INSERT INTO {ks}.part_keys (dataset, shard, part_key, start_time, end_time) "
            "VALUES (?, ?, ?, ?, ?) USING TTL ?"
        )
        # ALLOW FILTERING only filters inside the one partition the key names.
        self._select_part_keys = p(
            "SELECT part_key, start_time, end_time FROM {ks}.part_keys "
            "WHERE dataset = ? AND shard = ? AND start_time <= ? AND end_time >= ? ALLOW FILTERING"
        )
        self._insert_chunk = p(
            "INSERT INTO {ks}.chunks "
            "(dataset, shard, part_key, start_time, end_time, num_samples, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL ?"
        )
        self._count_bytes = p(
            "UPDATE {ks}.chunk_bytes SET bytes = bytes + ?, chunks = chunks + ? "
            "WHERE dataset = ? AND day = ?"
        )
        self._select_retention = p(_SELECT_RETENTION)
        self._select_chunk_sizes = p(
            "SELECT start_time, data FROM {ks}.chunks "
            "WHERE dataset = ? AND shard = ? AND part_key = ?"
        )
        self._delete_chunks = p(
            "DELETE FROM {ks}.chunks WHERE dataset = ? AND shard = ? AND part_key = ?"
        )
        self._delete_part_key = p(
            "DELETE FROM {ks}.part_keys WHERE dataset = ? AND shard = ? AND part_key = ?"
        )
        self._select_part_key = p(
            "SELECT part_key FROM {ks}.part_keys WHERE dataset = ? AND shard = ? AND part_key = ?"
        )
        self._select_bytes = p("SELECT day, bytes, chunks FROM {ks}.chunk_bytes WHERE dataset = ?")
        self._forget_bytes = p("DELETE FROM {ks}.chunk_bytes WHERE dataset = ? AND day = ?")
        self._select_chunks = p(
            "SELECT start_time, end_time, num_samples, data FROM {ks}.chunks "
            "WHERE dataset = ? AND shard = ? AND part_key = ? AND start_time >= ? "
            "AND start_time <= ? AND end_time >= ? ALLOW FILTERING"
        )

        self._insert_snapshot = p(
            "INSERT INTO {ks}.open_snapshots "
            "(dataset, shard, flush_group, offset, epoch, page, pages, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._select_snapshot = p(
            "SELECT epoch, page, pages, data FROM {ks}.open_snapshots "
            "WHERE dataset = ? AND shard = ? AND flush_group = ? AND offset = ?"
        )
        self._delete_snapshots = p(
            "DELETE FROM {ks}.open_snapshots "
            "WHERE dataset = ? AND shard = ? AND flush_group = ? AND offset < ?"
        )

    def _batched(
        self, stmt: PreparedStatement, rows: list[tuple[Any, ...]], sizes: list[int]
    ) -> Iterator[tuple[Statement | PreparedStatement, Sequence[Any] | None]]:
        """Rows of one partition as UNLOGGED batches under Cassandra's batch size limits."""
        if len(rows) == 1:
            yield stmt, rows[0]
            return
        batch, size = BatchStatement(batch_type=BatchType.UNLOGGED), 0
        for row, n in zip(rows, sizes, strict=True):
            if len(batch) and (len(batch) >= _BATCH_ROWS or size + n > _BATCH_BYTES):
                yield batch, None
                batch, size = BatchStatement(batch_type=BatchType.UNLOGGED), 0
            batch.add(stmt, row)
            size += n
        yield batch, None

    def _write_open_snapshot(
        self, name: str, shard: int, group: int, offset: int, epoch: int, data: bytes
    ) -> None:
        pages = max(1, -(-len(data) // _SNAPSHOT_PAGE))
        rows = (
            (
                self._insert_snapshot,
                (
                    name,
                    shard,
                    group,
                    offset,
                    epoch,
                    i,
                    pages,
                    data[i * _SNAPSHOT_PAGE :][:_SNAPSHOT_PAGE],
                ),
            )
            for i in range(pages)
        )
        self._conn.execute_many(rows, self.write_concurrency)

    def _read_open_snapshot(self, name: str, shard: int, group: int, offset: int) -> bytes | None:
        rows = self._conn.execute(self._select_snapshot, (name, shard, group, offset), _DATA)
        by_epoch: dict[int, dict[int, tuple[int, bytes]]] = {}
        with _translate(f"reading an open-buffer snapshot on {self._conn.where}"):
            for epoch, page, pages, data in rows:
                by_epoch.setdefault(epoch, {})[page] = (pages, data)
        for epoch in sorted(by_epoch, reverse=True):
            parts = by_epoch[epoch]
            pages = next(iter(parts.values()))[0]
            if set(parts) == set(range(pages)):
                return b"".join(parts[i][1] for i in range(pages))
        return None

    def _drop_open_snapshots(self, name: str, shard: int, group: int, below: int) -> None:
        self._conn.execute(self._delete_snapshots, (name, shard, group, below), _DATA)

    def _own_retention(self, name: str) -> int | None:
        """Cached a few seconds: read on every chunk read, changed rarely."""
        cache = self._conn.retention_cache
        hit = cache.get(name)
        now = time.monotonic()
        if hit is not None and now - hit[0] < _RETENTION_CACHE_S:
            return hit[1]
        value = _read_retention(self._conn, self._select_retention, name)
        cache[name] = (now, value)
        return value

    def _sweep(self, name: str, cutoff: int, part_key_cutoff: int) -> SweepResult:
        """The rows expire by their TTL; forget the counts of the days wholly past retention."""
        gone = [
            (day, size)
            for day, size, _ in self._day_counts(name)
            if day + _BYTES_DAY_MS + self.max_chunk_span_ms <= cutoff
        ]
        for day, _ in gone:
            self._conn.execute(self._forget_bytes, (name, day), _DATA)
        return SweepResult(len(gone), sum(size for _, size in gone), 0)

    def _day_counts(self, name: str) -> list[tuple[int, int, int]]:
        rows = self._conn.execute(self._select_bytes, (name,), _DATA)
        with _translate(f"reading byte counts on {self._conn.where}"):
            return [(day, size or 0, n or 0) for day, size, n in rows]

    def _stored_bytes(self, name: str) -> StoredBytes:
        days = sorted(self._day_counts(name))
        return StoredBytes(
            sum(d[1] for d in days), sum(d[2] for d in days), tuple((d[0], d[1]) for d in days)
        )

    def _write_part_keys(
        self, name: str, shard: int, records: list[PartKeyRecord], retention_ms: int, now_ms: int
    ) -> None:
        _check_part_keys(name, (r.part_key for r in records))
        rows = [
            (
                name,
                shard,
                r.part_key,
                r.start_time,
                r.end_time,
                _ttl_s(r.end_time, retention_ms, now_ms),
            )
            for r in records
        ]
        sizes = [len(r.part_key) + 32 for r in records]
        self._conn.execute_many(
            self._batched(self._insert_part_key, rows, sizes), self.write_concurrency
        )

    def _list_part_keys(self, name: str, shard: int, start: int, end: int) -> list[PartKeyRecord]:
        rows = self._conn.execute(self._select_part_keys, (name, shard, end, start), _DATA)
        with _translate(f"listing part keys on {self._conn.where}"):
            return [PartKeyRecord(*r) for r in rows]  # iterating fetches further pages

    def _write_chunks(
        self, name: str, shard: int, chunks: list[ChunkRecord], retention_ms: int, now_ms: int
    ) -> None:
        by_key: dict[str, list[ChunkRecord]] = {}
        per_day: dict[int, list[int]] = {}
        for c in chunks:
            by_key.setdefault(c.part_key, []).append(c)
            day = per_day.setdefault(c.start_time - c.start_time % _BYTES_DAY_MS, [0, 0])
            day[0] += len(c.data)
            day[1] += 1
        _check_part_keys(name, by_key)

        def statements() -> Iterator[tuple[Statement | PreparedStatement, Sequence[Any] | None]]:
            for key, cs in by_key.items():
                rows = [
                    (
                        name,
                        shard,
                        key,
                        c.start_time,
                        c.end_time,
                        c.num_samples,
                        c.data,
                        _ttl_s(c.end_time, retention_ms, now_ms),
                    )
                    for c in cs
                ]
                sizes = [len(c.data) + len(key) + 48 for c in cs]
                yield from self._batched(self._insert_chunk, rows, sizes)

        self._conn.execute_many(statements(), self.write_concurrency)
        # Counted after the rows are in: a failed write counts nothing, a retried one (or a
        # replay's rewrite) counts again, so the counts are an upper bound.
        self._conn.execute_many(
            ((self._count_bytes, (size, n, name, day)) for day, (size, n) in per_day.items()),
            self.write_concurrency,
        )

    def _delete_series(self, name: str, shard: int, part_keys: list[str]) -> int:
        """One partition delete per series (a single tombstone, whatever its chunks), after
        reading its chunks' sizes so the byte counts go down by what leaves."""
        limit = _max_part_key_bytes(name)
        keys = [k for k in part_keys if len(k.encode()) <= limit]
        args = [(name, shard, k) for k in keys]
        sizes = self._conn.execute_many(
            ((self._select_chunk_sizes, a) for a in args), self.read_concurrency
        )
        found = self._conn.execute_many(
            ((self._select_part_key, a) for a in args), self.read_concurrency
        )
        per_day: dict[int, list[int]] = {}
        with _translate(f"deleting series on {self._conn.where}"):
            for rows in sizes:
                for start_time, data in rows:
                    day = per_day.setdefault(start_time - start_time % _BYTES_DAY_MS, [0, 0])
                    day[0] += len(data or b"")
                    day[1] += 1
            known = sum(1 for rows in found if list(rows))
        self._conn.execute_many(
            ((stmt, a) for a in args for stmt in (self._delete_chunks, self._delete_part_key)),
            self.write_concurrency,
        )
        self._conn.execute_many(
            ((self._count_bytes, (-size, -n, name, day)) for day, (size, n) in per_day.items()),
            self.write_concurrency,
        )
        return known

    def _read_chunks(
        self, name: str, shard: int, part_keys: list[str], lo: int, start: int, end: int
    ) -> dict[str, list[ChunkRecord]]:
        limit = _max_part_key_bytes(name)  # a longer key cannot have been stored: no chunks
        part_keys = [k for k in part_keys if len(k) <= limit // 4 or len(k.encode()) <= limit]
        results = self._conn.execute_many(
            ((self._select_chunks, (name, shard, k, lo, end, start)) for k in part_keys),
            self.read_concurrency,
        )
        found: dict[str, list[ChunkRecord]] = {}
        with _translate(f"reading chunks on {self._conn.where}"):
            for key, rows in zip(part_keys, results, strict=True):
                chunks = [ChunkRecord(key, *r) for r in rows]
                if chunks:
                    found[key] = chunks
        return found


def open_cassandra_stores(
    contact_points: Sequence[str],
    port: int = 9042,
    keyspace: str = "filopy",
    replication: Mapping[str, str] | None = None,
    consistency: str = "LOCAL_QUORUM",
    connect_timeout_s: float = 10.0,
    request_timeout_s: float = 10.0,
    *,
    data_consistency: str | None = None,
    local_dc: str | None = None,
    max_chunk_span_ms: int = DEFAULT_MAX_CHUNK_SPAN_MS,
    write_concurrency: int = 64,
    read_concurrency: int = 64,
    auth_provider: AuthProvider | None = None,
    ssl_context: ssl.SSLContext | None = None,
    default_retention_ms: int = 0,
) -> tuple[CassandraMetaStore, CassandraColumnStore]:
    """Connect (StoreUnavailable if Cassandra cannot be reached), create the schema if missing,
    and return the two stores sharing the connection; close both to disconnect."""
    conn = CassandraConnection(
        contact_points,
        port,
        keyspace,
        replication,
        consistency,
        connect_timeout_s,
        request_timeout_s,
        data_consistency=data_consistency,
        local_dc=local_dc,
        auth_provider=auth_provider,
        ssl_context=ssl_context,
    ).acquire()  # held while the stores are built, so a failure shuts it down
    try:
        meta = CassandraMetaStore(conn)
        try:
            column = CassandraColumnStore(
                conn,
                max_chunk_span_ms,
                write_concurrency=write_concurrency,
                read_concurrency=read_concurrency,
                default_retention_ms=default_retention_ms,
            )
        except BaseException:
            meta.close()
            raise
        return meta, column
    finally:
        conn.release()
