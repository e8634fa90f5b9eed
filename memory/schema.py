"""The memory database schema, as numbered migrations tracked in ``PRAGMA user_version``.

Each migration is applied once, in order, inside one ``BEGIN IMMEDIATE`` transaction together with
the ``user_version`` bump, so a crash mid-migration leaves the previous version intact. Migrations
are only ever appended to :data:`MIGRATIONS`; an applied one is never edited.

Layer 0, the log, is append-only *in the database itself*: triggers refuse UPDATE and DELETE (and
an ``INSERT OR REPLACE`` that would silently delete a row) for any connection, not just ours. The
one exception is an audited erasure on the owner's request (memory/erasure.py): its transaction
inserts a row into ``erasure_grant``, does its changes and its audit record, deletes the grant and
commits. While ``erasure_grant`` is empty, which is always outside such a transaction, the log
cannot change.
"""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

import structlog

from memory.errors import SchemaError as SchemaError  # noqa: PLC0414 (its old home)

log = structlog.get_logger(__name__)


class Migration(NamedTuple):
    version: int
    description: str
    sql: str


_MIGRATION_1 = """
CREATE TABLE log (
    id            INTEGER PRIMARY KEY CHECK (id > 0),
    direction     TEXT NOT NULL CHECK (direction IN ('in', 'out')),
    stream_id     TEXT NOT NULL,
    kind          TEXT NOT NULL,
    channel       TEXT NOT NULL,
    session       TEXT NOT NULL,
    conversation  TEXT NOT NULL,
    sender        TEXT NOT NULL,
    sender_name   TEXT NOT NULL DEFAULT '',
    entity        TEXT,
    is_owner      INTEGER NOT NULL,
    privacy       TEXT NOT NULL CHECK (privacy IN ('owner', 'direct', 'group')),
    text          TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    reply_id      TEXT,
    platform_ts   REAL,
    recorded_ts   REAL NOT NULL,
    extra         TEXT NOT NULL DEFAULT '{}',
    UNIQUE (direction, stream_id)
);

CREATE INDEX log_conversation_id ON log (conversation, id);

-- One row exists only inside an audited erasure transaction (memory/erasure.py).
CREATE TABLE erasure_grant (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    requested_by TEXT NOT NULL,
    reason      TEXT NOT NULL,
    granted_at  REAL NOT NULL
);

CREATE TRIGGER log_no_update BEFORE UPDATE ON log
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'log is append-only: UPDATE refused');
END;

CREATE TRIGGER log_no_delete BEFORE DELETE ON log
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'log is append-only: DELETE refused');
END;

-- REPLACE deletes the old row without firing delete triggers (unless recursive_triggers is on),
-- so a write to an existing key is turned into a no-op before any conflict handling runs. This is
-- exactly what INSERT ... ON CONFLICT DO NOTHING does anyway, so idempotent appends are unchanged.
-- (NEW.id is -1 in a BEFORE INSERT trigger when the id is assigned automatically.)
CREATE TRIGGER log_no_replace BEFORE INSERT ON log
WHEN EXISTS (SELECT 1 FROM log WHERE direction = NEW.direction AND stream_id = NEW.stream_id)
  OR (NEW.id > 0 AND EXISTS (SELECT 1 FROM log WHERE id = NEW.id))
BEGIN
    SELECT RAISE(IGNORE);
END;

CREATE TABLE reply_status (
    reply_id  TEXT NOT NULL,
    status    TEXT NOT NULL CHECK (status IN ('expired', 'delivered')),
    at        REAL NOT NULL,
    detail    TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (reply_id, status)
);

CREATE TRIGGER reply_status_no_replace BEFORE INSERT ON reply_status
WHEN EXISTS (SELECT 1 FROM reply_status WHERE reply_id = NEW.reply_id AND status = NEW.status)
BEGIN
    SELECT RAISE(IGNORE);
END;

CREATE TRIGGER reply_status_no_update BEFORE UPDATE ON reply_status
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'reply_status is append-only: UPDATE refused');
END;

CREATE TRIGGER reply_status_no_delete BEFORE DELETE ON reply_status
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'reply_status is append-only: DELETE refused');
END;
"""

_MIGRATION_2 = """
-- Identity: entities, their handles per channel, and links between entities.
CREATE TABLE entity (
    id          TEXT PRIMARY KEY,   -- 'owner' for the owner, else 'e-<hex>'
    kind        TEXT NOT NULL CHECK (kind IN ('person', 'agent', 'service', 'group')),
    name        TEXT NOT NULL DEFAULT '',
    created_ts  REAL NOT NULL
);

CREATE TABLE handle (
    channel     TEXT NOT NULL,
    address     TEXT NOT NULL,      -- normalized: trimmed, case-folded
    entity      TEXT NOT NULL REFERENCES entity (id),
    display     TEXT NOT NULL DEFAULT '',
    first_seen  REAL NOT NULL,
    PRIMARY KEY (channel, address)
);
CREATE INDEX handle_entity ON handle (entity);

-- Link events, append-only: the latest event for a pair is its state. 'verified' (confirmed by
-- the owner) joins two entities into one person for the privacy rule; 'suggested' never merges
-- anything; 'unlinked' undoes a link; 'rejected' dismisses a suggestion.
CREATE TABLE entity_link (
    id      INTEGER PRIMARY KEY,
    a       TEXT NOT NULL REFERENCES entity (id),
    b       TEXT NOT NULL REFERENCES entity (id),
    status  TEXT NOT NULL CHECK (status IN ('verified', 'suggested', 'unlinked', 'rejected')),
    reason  TEXT NOT NULL DEFAULT '',
    actor   TEXT NOT NULL,          -- 'owner', 'model' or 'system'
    ts      REAL NOT NULL,
    stream_id TEXT UNIQUE,          -- the command that recorded it (replays add nothing)
    CHECK (a < b)
);
CREATE INDEX entity_link_pair ON entity_link (a, b, id);

CREATE INDEX log_entity_id ON log (entity, id);
"""

_MIGRATION_3 = """
-- Full-text search over the log (FTS5, external content: the text is stored once, in log).
CREATE VIRTUAL TABLE log_fts USING fts5(
    text, sender_name,
    content = 'log', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
INSERT INTO log_fts (rowid, text, sender_name) SELECT id, text, sender_name FROM log;

CREATE TRIGGER log_fts_insert AFTER INSERT ON log BEGIN
    INSERT INTO log_fts (rowid, text, sender_name) VALUES (new.id, new.text, new.sender_name);
END;
-- only an audited erasure can update or delete log rows; the index follows it
CREATE TRIGGER log_fts_update AFTER UPDATE ON log BEGIN
    INSERT INTO log_fts (log_fts, rowid, text, sender_name)
        VALUES ('delete', old.id, old.text, old.sender_name);
    INSERT INTO log_fts (rowid, text, sender_name) VALUES (new.id, new.text, new.sender_name);
END;
CREATE TRIGGER log_fts_delete AFTER DELETE ON log BEGIN
    INSERT INTO log_fts (log_fts, rowid, text, sender_name)
        VALUES ('delete', old.id, old.text, old.sender_name);
END;
"""

_MIGRATION_4 = """
-- Scoped notes (seed 003): typed, scoped, with visibility; updates supersede, never overwrite.
CREATE TABLE note (
    id          INTEGER PRIMARY KEY,
    type        TEXT NOT NULL CHECK (type IN ('fact', 'decision', 'action', 'question', 'note')),
    topic       TEXT NOT NULL DEFAULT '',
    text        TEXT NOT NULL,
    scope       TEXT NOT NULL CHECK (scope IN ('shared', 'chat', 'agent', 'team')),
    visibility  TEXT NOT NULL CHECK (visibility IN ('public', 'private', 'internal')),
    chat        TEXT,               -- the conversation a chat-scoped note belongs to
    role        TEXT,               -- the agent role that wrote / owns it
    team        TEXT,               -- the team a team-scoped note is shared in
    project     TEXT,
    source_conversation TEXT,       -- where it was learned, and that conversation's privacy:
    source_privacy TEXT CHECK (source_privacy IN ('owner', 'direct', 'group')),
    source_entity TEXT,             -- the person it was learned from
    supersedes  INTEGER REFERENCES note (id),
    author      TEXT NOT NULL DEFAULT 'model',   -- 'model' (a tool) or 'owner' (the CLI)
    created_ts  REAL NOT NULL,
    stream_id   TEXT,               -- the entry whose turn wrote it
    op_key      TEXT UNIQUE         -- idempotency key (stream id + call index): replays add nothing
);
CREATE INDEX note_supersedes ON note (supersedes);
CREATE INDEX note_scope ON note (scope, visibility);

CREATE VIRTUAL TABLE note_fts USING fts5(
    topic, text, content = 'note', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER note_fts_insert AFTER INSERT ON note BEGIN
    INSERT INTO note_fts (rowid, topic, text) VALUES (new.id, new.topic, new.text);
END;
CREATE TRIGGER note_fts_update AFTER UPDATE ON note BEGIN
    INSERT INTO note_fts (note_fts, rowid, topic, text)
        VALUES ('delete', old.id, old.topic, old.text);
    INSERT INTO note_fts (rowid, topic, text) VALUES (new.id, new.topic, new.text);
END;
CREATE TRIGGER note_fts_delete AFTER DELETE ON note BEGIN
    INSERT INTO note_fts (note_fts, rowid, topic, text)
        VALUES ('delete', old.id, old.topic, old.text);
END;
CREATE TRIGGER note_no_update BEFORE UPDATE ON note
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'notes are append-only (supersede instead): UPDATE refused');
END;
CREATE TRIGGER note_no_delete BEFORE DELETE ON note
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'notes are append-only (supersede instead): DELETE refused');
END;
"""

_MIGRATION_5 = """
-- Audited erasure (the one exception to append-only): a tombstone per erasure.
CREATE TABLE erasure (
    id          INTEGER PRIMARY KEY,
    ts          REAL NOT NULL,
    requested_by TEXT NOT NULL,
    reason      TEXT NOT NULL,
    target_kind TEXT NOT NULL CHECK (target_kind IN ('entity', 'conversation', 'id')),
    target      TEXT NOT NULL,
    log_rows    INTEGER NOT NULL,   -- how many log rows had their text removed
    notes       INTEGER NOT NULL,   -- how many notes derived from them were removed
    detail      TEXT NOT NULL DEFAULT '{}',   -- JSON: the ids affected
    stream_id   TEXT UNIQUE         -- the command that asked for it (replays add nothing)
);
CREATE TRIGGER erasure_no_update BEFORE UPDATE ON erasure
BEGIN
    SELECT RAISE(ABORT, 'erasure tombstones are permanent');
END;
CREATE TRIGGER erasure_no_delete BEFORE DELETE ON erasure
BEGIN
    SELECT RAISE(ABORT, 'erasure tombstones are permanent');
END;
"""

_MIGRATION_6 = """
-- New log rows are indexed for full-text search by the writer, one statement per batch
-- (MemoryStore.sync_index), not by a trigger per row: FTS5 flushes its pending terms at the end
-- of every statement that writes it, so a row at a time cost ~5x more. Updates and deletes
-- (audited erasure) keep their triggers; the writer indexes its new rows before either.
DROP TRIGGER log_fts_insert;
"""

_MIGRATION_7 = """
-- What is indexed, in the database itself: every log row with id <= fts_state.indexed_to is in
-- log_fts, none above it. The writer indexes the rows above it and moves it in the same
-- transaction (MemoryStore.sync_index), so a savepoint or transaction rolled back, a crash
-- between two statements, or rows written by a process without the index code (a worker of an
-- older release during an upgrade) can never leave a row out of the index or in it twice: the
-- next sync catches up. At this version every row is indexed (migration 6 left none behind).
CREATE TABLE fts_state (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    indexed_to  INTEGER NOT NULL
);
INSERT INTO fts_state (id, indexed_to) SELECT 1, coalesce(max(id), 0) FROM log;

-- An erasure of a row not indexed yet must not ask FTS5 to delete terms it does not hold (that
-- corrupts the index): the index follows updates and deletes of indexed rows only; a row above
-- the mark is indexed later with the text it has then.
DROP TRIGGER log_fts_update;
DROP TRIGGER log_fts_delete;
CREATE TRIGGER log_fts_update AFTER UPDATE ON log
WHEN old.id <= (SELECT indexed_to FROM fts_state)
BEGIN
    INSERT INTO log_fts (log_fts, rowid, text, sender_name)
        VALUES ('delete', old.id, old.text, old.sender_name);
    INSERT INTO log_fts (rowid, text, sender_name) VALUES (new.id, new.text, new.sender_name);
END;
CREATE TRIGGER log_fts_delete AFTER DELETE ON log
WHEN old.id <= (SELECT indexed_to FROM fts_state)
BEGIN
    INSERT INTO log_fts (log_fts, rowid, text, sender_name)
        VALUES ('delete', old.id, old.text, old.sender_name);
END;
"""

_MIGRATION_8 = """
-- A reply's final status may also be 'failed': the platform refused it for good (an SMTP 5xx),
-- reported by the gateway like 'delivered' and 'expired'. SQLite cannot change a CHECK, so the
-- table is rebuilt with its rows; DROP TABLE fires no DELETE trigger, and the triggers (dropped
-- with the old table) are made again as they were.
CREATE TABLE reply_status_new (
    reply_id  TEXT NOT NULL,
    status    TEXT NOT NULL CHECK (status IN ('expired', 'delivered', 'failed')),
    at        REAL NOT NULL,
    detail    TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (reply_id, status)
);
INSERT INTO reply_status_new (reply_id, status, at, detail)
    SELECT reply_id, status, at, detail FROM reply_status;
DROP TABLE reply_status;
ALTER TABLE reply_status_new RENAME TO reply_status;

CREATE TRIGGER reply_status_no_replace BEFORE INSERT ON reply_status
WHEN EXISTS (SELECT 1 FROM reply_status WHERE reply_id = NEW.reply_id AND status = NEW.status)
BEGIN
    SELECT RAISE(IGNORE);
END;

CREATE TRIGGER reply_status_no_update BEFORE UPDATE ON reply_status
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'reply_status is append-only: UPDATE refused');
END;

CREATE TRIGGER reply_status_no_delete BEFORE DELETE ON reply_status
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'reply_status is append-only: DELETE refused');
END;
"""

# Fenced writes (memory/fence.py): the highest worker-lease token memory has seen. And replays
# across a Redis data loss: an entry published twice (a gateway's cursor rolled back with the
# stream) has a new stream id but the same platform event id, found through this index.
_MIGRATION_9 = """
CREATE TABLE writer_fence (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL
);
INSERT INTO writer_fence (id, epoch) VALUES (1, 0);
CREATE INDEX log_inbound_event ON log (channel, event_id) WHERE direction = 'in';
"""

# Collected turns (worker/consumer.py, [turns] mode = "collect"): one reply answers several
# messages of a session. The reply row is keyed by the last of them (its stream id); each other
# one it answers is listed here, so a replay of any of them finds the reply already recorded.
_MIGRATION_10 = """
CREATE TABLE reply_covers (
    stream_id   TEXT PRIMARY KEY,  -- an inbound entry the reply answers besides its own key
    answered_by TEXT NOT NULL      -- the stream id the reply row is keyed by
) WITHOUT ROWID;
CREATE INDEX reply_covers_by ON reply_covers (answered_by);
"""

# Merging into the owner (memory/identity.py, ``entities.merge``): each move of a handle from an
# entity to the owner, with who asked, why and when. Append-only: the audit of who the owner is.
_MIGRATION_11 = """
CREATE TABLE handle_move (
    id          INTEGER PRIMARY KEY,
    channel     TEXT NOT NULL,
    address     TEXT NOT NULL,
    from_entity TEXT NOT NULL,
    to_entity   TEXT NOT NULL,
    reason      TEXT NOT NULL DEFAULT '',
    actor       TEXT NOT NULL,
    ts          REAL NOT NULL,
    stream_id   TEXT NOT NULL          -- the command that moved it (a replay moves nothing)
);
CREATE INDEX handle_move_stream ON handle_move (stream_id);
CREATE TRIGGER handle_move_no_update BEFORE UPDATE ON handle_move
BEGIN
    SELECT RAISE(ABORT, 'handle_move is append-only: UPDATE refused');
END;
CREATE TRIGGER handle_move_no_delete BEFORE DELETE ON handle_move
BEGIN
    SELECT RAISE(ABORT, 'handle_move is append-only: DELETE refused');
END;
"""

# Layer 1 (memory/summaries.py): a conversation's summaries, each naming the exact range of log ids
# it covers (first_id..last_id, every row of the conversation between them). Derived by the jobs
# and applied by the worker; never edited: a new version supersedes an old one (``supersedes``),
# and only an audited erasure (erasure_grant) may blank one (``erased``: the erasure's id).
_MIGRATION_12 = """
CREATE TABLE summary (
    id           INTEGER PRIMARY KEY,
    conversation TEXT NOT NULL,
    channel      TEXT NOT NULL,
    privacy      TEXT NOT NULL,
    first_id     INTEGER NOT NULL,
    last_id      INTEGER NOT NULL,
    rows         INTEGER NOT NULL,
    first_ts     REAL NOT NULL,
    last_ts      REAL NOT NULL,
    text         TEXT NOT NULL,
    method       TEXT NOT NULL CHECK (method IN ('model', 'fallback')),
    job_key      TEXT NOT NULL UNIQUE,
    supersedes   INTEGER,
    erased       INTEGER,
    created      REAL NOT NULL,
    CHECK (first_id <= last_id)
);
CREATE INDEX summary_by_conversation ON summary (conversation, last_id);
CREATE INDEX summary_by_supersedes ON summary (supersedes) WHERE supersedes IS NOT NULL;

CREATE VIRTUAL TABLE summary_fts USING fts5(
    text, content = 'summary', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
CREATE TRIGGER summary_fts_insert AFTER INSERT ON summary BEGIN
    INSERT INTO summary_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER summary_fts_update AFTER UPDATE ON summary BEGIN
    INSERT INTO summary_fts (summary_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO summary_fts (rowid, text) VALUES (new.id, new.text);
END;

CREATE TRIGGER summary_no_update BEFORE UPDATE ON summary
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'summaries are superseded, never edited: UPDATE refused');
END;

CREATE TRIGGER summary_no_delete BEFORE DELETE ON summary
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'summaries are superseded, never deleted: DELETE refused');
END;
"""

# The log in its messages' time (memory.rows.order_key: recorded_ts, then id): context windows and
# the writer's caches read the newest rows of the log, of a conversation and of a sender this way
# (an imported history's older messages are older, though their ids are higher). Each index ends
# in the rowid, so it serves ORDER BY recorded_ts DESC, id DESC.
_MIGRATION_13 = """
CREATE INDEX log_time ON log (recorded_ts);
CREATE INDEX log_conversation_time ON log (conversation, recorded_ts);
CREATE INDEX log_entity_time ON log (entity, recorded_ts);
"""

# The (entity, recorded_ts) index of migration 13 serves every lookup of a person's rows (they are
# equalities on the entity: a direct scope's visibility, erasure by person, counts); the older
# (entity, id) one only cost every insert an eighth b-tree (bench/pipeline.py: ~6% of the worker's
# throughput). A search's incremental read of a person's new ids reads the rowid range instead
# (memory/search/index.py).
_MIGRATION_14 = """
DROP INDEX IF EXISTS log_entity_id;
"""

# A reply may also be 'withheld': right before posting, its gateway found that it would reach
# people it was not written for (someone invited meanwhile, the room made public), and did not
# post it (its recheck). The table is rebuilt as in migration 8.
_MIGRATION_15 = _MIGRATION_8.replace(
    "CHECK (status IN ('expired', 'delivered', 'failed'))",
    "CHECK (status IN ('expired', 'delivered', 'failed', 'withheld'))",
)

# MEMORY.md's versions (memory/curated_versions.py): each write of the file records the text it
# wrote (and a hand edit found before it). Never edited; only an audited erasure (erasure_grant)
# may delete a version (one that holds erased text, or was written by a derived turn).
_MIGRATION_16 = """
CREATE TABLE curated_version (
    id         INTEGER PRIMARY KEY,
    ts         REAL NOT NULL,
    text       TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    cause      TEXT NOT NULL,
    stream_id  TEXT
);

CREATE TRIGGER curated_version_no_update BEFORE UPDATE ON curated_version
BEGIN
    SELECT RAISE(ABORT, 'MEMORY.md versions are kept as they were: UPDATE refused');
END;

CREATE TRIGGER curated_version_no_delete BEFORE DELETE ON curated_version
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'MEMORY.md versions are kept: DELETE refused (erasure only)');
END;
"""

# Scheduled work (memory/schedule.py): reminders and recurring tasks, stored by the one writer and
# fired by the jobs' scheduler as ``scheduled`` entries (event id ``schedule:<id>:<occurrence>``).
# An item changes as it fires (next_due, counts, status), so the table is not append-only; its
# text is: only an audited erasure (erasure_grant) may change it (it blanks it) or delete a row.
# ``scheduled_runs`` is the ledger of what each occurrence became, one row per occurrence (its
# key is what makes recording an occurrence happen once); it holds no text and is never edited.
_MIGRATION_17 = """
CREATE TABLE scheduled (
    id              INTEGER PRIMARY KEY,
    created         REAL NOT NULL,
    created_by      TEXT NOT NULL,      -- the stream id of the turn (or cmd:<id> of the command)
    setter_entity   TEXT,               -- the entity of whoever set it (memory.identity)
    setter          TEXT NOT NULL,      -- their handle (the per-sender limits count by it)
    channel         TEXT NOT NULL,
    session         TEXT NOT NULL,
    conversation    TEXT NOT NULL,
    privacy         TEXT NOT NULL CHECK (privacy IN ('owner', 'direct', 'group')),
    text            TEXT NOT NULL,
    first_due       INTEGER NOT NULL,
    cron            TEXT,
    until           REAL,
    late            TEXT NOT NULL CHECK (late IN ('deliver', 'skip')),
    grace           REAL NOT NULL CHECK (grace >= 0),
    next_due        INTEGER,
    status          TEXT NOT NULL CHECK (status IN ('active', 'done', 'cancelled', 'erased')),
    fired           INTEGER NOT NULL DEFAULT 0,
    skipped         INTEGER NOT NULL DEFAULT 0,
    last_occurrence INTEGER,
    last_outcome    TEXT CHECK (last_outcome IN ('delivered', 'late', 'skipped')),
    enqueued_for    INTEGER,            -- the next_due an rq job was made for
    ended           REAL,
    end_reason      TEXT,
    CHECK ((status = 'active') = (next_due IS NOT NULL))
);
CREATE INDEX scheduled_due ON scheduled (status, next_due);
CREATE INDEX scheduled_conversation ON scheduled (conversation, status);
CREATE INDEX scheduled_setter ON scheduled (setter, status);
CREATE INDEX scheduled_setter_entity ON scheduled (setter_entity) WHERE setter_entity IS NOT NULL;
-- the turn or command that set an item: a replay finds it (memory.schedule.add), an erasure too
CREATE INDEX scheduled_created_by ON scheduled (created_by);
-- a replayed turn adds nothing twice; an erased item's blank text is no longer its key
CREATE UNIQUE INDEX scheduled_once ON scheduled (created_by, text, first_due, coalesce(cron, ''))
    WHERE status != 'erased';

CREATE TRIGGER scheduled_text_kept BEFORE UPDATE OF text ON scheduled
WHEN NEW.text IS NOT OLD.text AND NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'a scheduled item keeps its text (erasure only): UPDATE refused');
END;
CREATE TRIGGER scheduled_no_delete BEFORE DELETE ON scheduled
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'scheduled items are ended, never deleted: DELETE refused');
END;

CREATE TABLE scheduled_runs (
    item        INTEGER NOT NULL,
    occurrence  INTEGER NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('delivered', 'late', 'skipped')),
    stream_id   TEXT NOT NULL,
    at          REAL NOT NULL,
    PRIMARY KEY (item, occurrence)
) WITHOUT ROWID;
CREATE TRIGGER scheduled_runs_no_update BEFORE UPDATE ON scheduled_runs
BEGIN
    SELECT RAISE(ABORT, 'scheduled_runs is a ledger: UPDATE refused');
END;
CREATE TRIGGER scheduled_runs_no_delete BEFORE DELETE ON scheduled_runs
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'scheduled_runs is a ledger: DELETE refused');
END;
"""

# The zone an item's times were computed in (memory/schedule.py ``Item.zone``): a cron item's
# occurrences are wall times in the owner's zone, so when ``[owner] timezone`` changes the worker
# recomputes the ``next_due`` of the items computed in another zone (worker/scheduling.py). NULL:
# an item stored before this column, taken to be in the zone in force when the worker first sees
# it. The index on the ledger's outcome and time answers "how many were skipped in the last day"
# (``schedule.health``) without reading every run.
_MIGRATION_18 = """
ALTER TABLE scheduled ADD COLUMN zone TEXT;
CREATE INDEX scheduled_runs_outcome ON scheduled_runs (outcome, at);
"""

# Layer 2 (memory/profiles.py): facts about an entity (the owner or a contact), each resting on log
# rows (``profile_evidence``, at least one) inside the range its job was given, with the privacy of
# its most private piece of evidence (``source_privacy``). Derived by the jobs and applied by the
# worker (memory/profile_apply.py), idempotent on ``job_key``; never edited: a new version
# supersedes an old one (``supersedes`` on the new row, ``superseded_by`` set once on the old one,
# from NULL to a fact's id, at most one successor each), a contradiction does the same and names
# the old fact in ``conflicts_with``, and a fact judged no longer relevant is retired
# (``retired``, ``retired_why``, set once from NULL). Those are the only changes outside an
# erasure; only an audited erasure (erasure_grant) may blank a fact (``erased``: the erasure's id)
# or delete anything. ``profile_runs``: one row per range the profile job was applied for (the
# layer-1 summary it was planned from: a new summary is a new run), never edited but by an erasure.
# Capability gaps: what someone needed that the assistant could not do; a gap's count, times and
# status change as it recurs and is closed (``closed_at``: when, for a reopening only by newer
# evidence), its ``needs`` may be named once, its description does not change (erasure only).
_MIGRATION_19 = """
CREATE TABLE profile_facts (
    id              INTEGER PRIMARY KEY,
    entity          TEXT NOT NULL,
    kind            TEXT NOT NULL CHECK (kind IN ('identity', 'preference', 'need', 'expectation',
                                                  'relationship', 'event')),
    text            TEXT NOT NULL,
    confidence      REAL NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    source_privacy  TEXT NOT NULL CHECK (source_privacy IN ('owner', 'direct', 'group')),
    conversation    TEXT NOT NULL,      -- the range its job was given: conversation, first..last
    first_id        INTEGER NOT NULL,
    last_id         INTEGER NOT NULL,
    first_seen      REAL NOT NULL,
    last_seen       REAL NOT NULL,
    method          TEXT NOT NULL CHECK (method IN ('model', 'fallback', 'replay')),
    supersedes      INTEGER REFERENCES profile_facts (id),
    superseded_by   INTEGER REFERENCES profile_facts (id),
    conflicts_with  INTEGER REFERENCES profile_facts (id),
    retired         REAL,               -- judged no longer relevant (memory/profile_apply.py)
    retired_why     TEXT,
    retired_by      TEXT,               -- the run (its key) whose range judged it: an erasure of
                                        -- that range takes the judgement back
    job_key         TEXT NOT NULL UNIQUE,
    created         REAL NOT NULL,
    erased          INTEGER,
    CHECK (first_id <= last_id),
    CHECK (first_seen <= last_seen),
    CHECK (conflicts_with IS NULL OR conflicts_with = supersedes),
    CHECK (retired_why IS NULL OR retired IS NOT NULL),
    CHECK (retired_by IS NULL OR retired IS NOT NULL),
    CHECK (retired IS NULL OR superseded_by IS NULL)
);
CREATE INDEX profile_facts_entity ON profile_facts (entity, superseded_by, erased);
-- a fact has at most one successor: two proposals superseding the same one cannot both land
CREATE UNIQUE INDEX profile_facts_supersedes ON profile_facts (supersedes)
    WHERE supersedes IS NOT NULL;

CREATE TABLE profile_evidence (
    fact    INTEGER NOT NULL REFERENCES profile_facts (id),
    log_id  INTEGER NOT NULL,
    PRIMARY KEY (fact, log_id)
) WITHOUT ROWID;
CREATE INDEX profile_evidence_log ON profile_evidence (log_id);

CREATE TRIGGER profile_facts_kept BEFORE UPDATE ON profile_facts
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant) AND (
    NEW.id IS NOT OLD.id OR NEW.entity IS NOT OLD.entity OR NEW.kind IS NOT OLD.kind
    OR NEW.text IS NOT OLD.text OR NEW.confidence IS NOT OLD.confidence
    OR NEW.source_privacy IS NOT OLD.source_privacy OR NEW.conversation IS NOT OLD.conversation
    OR NEW.first_id IS NOT OLD.first_id OR NEW.last_id IS NOT OLD.last_id
    OR NEW.first_seen IS NOT OLD.first_seen OR NEW.last_seen IS NOT OLD.last_seen
    OR NEW.method IS NOT OLD.method OR NEW.supersedes IS NOT OLD.supersedes
    OR NEW.conflicts_with IS NOT OLD.conflicts_with OR NEW.job_key IS NOT OLD.job_key
    OR NEW.created IS NOT OLD.created OR NEW.erased IS NOT OLD.erased
    OR OLD.erased IS NOT NULL OR OLD.superseded_by IS NOT NULL OR OLD.retired IS NOT NULL
    OR OLD.retired_why IS NOT NULL
    -- one change, from a current fact: superseded (a successor), or retired (when, and why)
    OR NOT (
        (NEW.superseded_by IS NOT NULL AND NEW.retired IS NULL AND NEW.retired_why IS NULL
         AND NEW.retired_by IS NULL)
        OR (NEW.superseded_by IS NULL AND NEW.retired IS NOT NULL)
    )
)
BEGIN
    SELECT RAISE(ABORT, 'profile facts are superseded or retired, never edited: UPDATE refused');
END;
CREATE TRIGGER profile_facts_no_delete BEFORE DELETE ON profile_facts
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'profile facts are superseded, never deleted: DELETE refused');
END;
CREATE TRIGGER profile_evidence_no_update BEFORE UPDATE ON profile_evidence
BEGIN
    SELECT RAISE(ABORT, 'profile evidence is kept as it was: UPDATE refused');
END;
CREATE TRIGGER profile_evidence_no_delete BEFORE DELETE ON profile_evidence
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'profile evidence is kept: DELETE refused (erasure only)');
END;

CREATE TABLE capability_gaps (
    id              INTEGER PRIMARY KEY,
    entity          TEXT NOT NULL,
    description     TEXT NOT NULL,
    needs           TEXT,               -- the capability it needs (a tool's name), if named
    source_privacy  TEXT NOT NULL CHECK (source_privacy IN ('owner', 'direct', 'group')),
    count           INTEGER NOT NULL CHECK (count >= 1),
    first_seen      REAL NOT NULL,
    last_seen       REAL NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('open', 'closed')),
    closed_reason   TEXT,
    closed_at       REAL,
    reopened        INTEGER NOT NULL DEFAULT 0 CHECK (reopened >= 0),
    job_key         TEXT NOT NULL UNIQUE,
    created         REAL NOT NULL,
    erased          INTEGER,
    CHECK (first_seen <= last_seen),
    CHECK ((status = 'closed') = (closed_reason IS NOT NULL)),
    CHECK ((status = 'closed') = (closed_at IS NOT NULL))
);
CREATE INDEX capability_gaps_status ON capability_gaps (status, last_seen);
CREATE INDEX capability_gaps_entity ON capability_gaps (entity);

CREATE TABLE gap_evidence (
    gap     INTEGER NOT NULL REFERENCES capability_gaps (id),
    log_id  INTEGER NOT NULL,
    PRIMARY KEY (gap, log_id)
) WITHOUT ROWID;
CREATE INDEX gap_evidence_log ON gap_evidence (log_id);

CREATE TRIGGER capability_gaps_kept BEFORE UPDATE ON capability_gaps
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant) AND (
    NEW.id IS NOT OLD.id OR NEW.entity IS NOT OLD.entity
    OR NEW.description IS NOT OLD.description OR NEW.job_key IS NOT OLD.job_key
    OR NEW.created IS NOT OLD.created OR NEW.erased IS NOT OLD.erased OR OLD.erased IS NOT NULL
    OR NEW.first_seen IS NOT OLD.first_seen OR NEW.count < OLD.count
    OR NEW.last_seen < OLD.last_seen OR NEW.reopened < OLD.reopened
    OR (NEW.needs IS NOT OLD.needs AND OLD.needs IS NOT NULL)
    -- its audience only narrows (the most private class of all its evidence)
    OR (NEW.source_privacy IS NOT OLD.source_privacy AND NOT (
        (OLD.source_privacy = 'group' AND NEW.source_privacy IN ('direct', 'owner'))
        OR (OLD.source_privacy = 'direct' AND NEW.source_privacy = 'owner')))
)
BEGIN
    SELECT RAISE(ABORT, 'a capability gap keeps its description (erasure only): UPDATE refused');
END;
CREATE TRIGGER capability_gaps_no_delete BEFORE DELETE ON capability_gaps
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'capability gaps are closed, never deleted: DELETE refused');
END;
CREATE TRIGGER gap_evidence_no_update BEFORE UPDATE ON gap_evidence
BEGIN
    SELECT RAISE(ABORT, 'gap evidence is kept as it was: UPDATE refused');
END;
CREATE TRIGGER gap_evidence_no_delete BEFORE DELETE ON gap_evidence
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'gap evidence is kept: DELETE refused (erasure only)');
END;
CREATE TABLE profile_runs (
    id              INTEGER PRIMARY KEY,
    conversation    TEXT NOT NULL,
    first_id        INTEGER NOT NULL,
    last_id         INTEGER NOT NULL,
    summary         INTEGER,            -- the layer-1 summary it was planned from
    run_key         TEXT NOT NULL UNIQUE,
    method          TEXT NOT NULL CHECK (method IN ('model', 'fallback', 'replay')),
    facts           INTEGER NOT NULL CHECK (facts >= 0),     -- facts added (new and versions)
    gaps            INTEGER NOT NULL CHECK (gaps >= 0),      -- gaps made or merged
    retired         INTEGER NOT NULL CHECK (retired >= 0),   -- facts retired
    refused         INTEGER NOT NULL CHECK (refused >= 0),   -- proposals memory did not take
    note            TEXT NOT NULL,      -- why a fallback
    read            TEXT NOT NULL DEFAULT '{}',  -- {"facts": [ids], "gaps": [ids]} its questions
                                        -- showed the model: an erasure of one takes back what
                                        -- it wrote from text (memory/profile_erasure.py)
    at              REAL NOT NULL,
    erased          INTEGER,
    CHECK (first_id <= last_id)
);
CREATE INDEX profile_runs_summary ON profile_runs (summary) WHERE summary IS NOT NULL;
CREATE INDEX profile_runs_range ON profile_runs (conversation, first_id, last_id);
CREATE TRIGGER profile_runs_kept BEFORE UPDATE ON profile_runs
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'profile_runs is a ledger: UPDATE refused (erasure only)');
END;
CREATE TRIGGER profile_runs_no_delete BEFORE DELETE ON profile_runs
WHEN NOT EXISTS (SELECT 1 FROM erasure_grant)
BEGIN
    SELECT RAISE(ABORT, 'profile_runs is a ledger: DELETE refused (erasure only)');
END;
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "layer 0: append-only log, erasure grant, reply status", _MIGRATION_1),
    Migration(2, "identity: entities, handles, links", _MIGRATION_2),
    Migration(3, "full-text search over the log", _MIGRATION_3),
    Migration(4, "scoped notes", _MIGRATION_4),
    Migration(5, "audited erasure tombstones", _MIGRATION_5),
    Migration(6, "full-text indexing by the writer, one statement per batch", _MIGRATION_6),
    Migration(7, "full-text index watermark", _MIGRATION_7),
    Migration(8, "reply status 'failed'", _MIGRATION_8),
    Migration(9, "fenced writes; inbound rows by platform event id", _MIGRATION_9),
    Migration(10, "collected replies: the messages one reply answers", _MIGRATION_10),
    Migration(11, "identity: audited merges of handles into the owner", _MIGRATION_11),
    Migration(12, "layer 1: conversation summaries over exact log ranges", _MIGRATION_12),
    Migration(13, "the log in its messages' time order", _MIGRATION_13),
    Migration(14, "a person's rows on the time index only", _MIGRATION_14),
    Migration(15, "reply status 'withheld'", _MIGRATION_15),
    Migration(16, "MEMORY.md's versions", _MIGRATION_16),
    Migration(17, "scheduled work: reminders, recurring tasks, their runs", _MIGRATION_17),
    Migration(18, "scheduled work: the zone an item's times are in; skips by time", _MIGRATION_18),
    Migration(
        19, "layer 2: profile facts with evidence, their runs; capability gaps", _MIGRATION_19
    ),
)

LATEST_VERSION = MIGRATIONS[-1].version


def statements(script: str) -> list[str]:
    """Split a script into complete statements (trigger bodies keep their inner semicolons)."""
    out: list[str] = []
    buf = ""
    for part in script.split(";"):
        buf += part + ";"
        if sqlite3.complete_statement(buf):
            stmt = buf.strip()
            if stmt.strip(";").strip():
                out.append(stmt)
            buf = ""
    if buf.strip(";").strip():
        raise SchemaError(f"incomplete SQL statement at end of migration: {buf.strip()[:80]!r}")
    return out


def schema_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def check_version(version: int) -> None:
    if version > LATEST_VERSION:
        raise SchemaError(
            f"the memory database is at schema version {version}, newer than this code "
            f"understands ({LATEST_VERSION}); upgrade relaybot"
        )


def migrate(conn: sqlite3.Connection) -> int:
    """Apply every pending migration, each in its own transaction; returns the final version.

    ``conn`` must be in autocommit mode (``isolation_level=None``) and not inside a transaction.
    The version is read after ``BEGIN IMMEDIATE`` so two processes cannot apply the same step.
    """
    for migration in MIGRATIONS:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(conn)
            check_version(current)
            if current >= migration.version:
                conn.execute("COMMIT")
                continue
            if current != migration.version - 1:
                raise SchemaError(f"schema version {current} cannot step to {migration.version}")
            for stmt in statements(migration.sql):
                conn.execute(stmt)
            # PRAGMA does not take parameters; the version is an int from our own table.
            conn.execute(f"PRAGMA user_version = {int(migration.version)}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        log.info("memory.migrated", version=migration.version, step=migration.description)
    return schema_version(conn)
