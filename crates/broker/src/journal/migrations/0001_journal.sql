-- The evidence journal. `events` is append-only: the writer never updates or deletes a
-- row, and the audit chain (hash column) makes any later change detectable.
CREATE TABLE events (
    -- Global, gap-free order assigned by the single writer; never wall-clock order.
    seq            INTEGER PRIMARY KEY,
    invocation_id  TEXT    NOT NULL,
    kind           TEXT    NOT NULL,
    -- Canonical JSON of the event body; exactly these bytes are hashed.
    body           TEXT    NOT NULL,
    -- For operators correlating systems; ordering comes from seq.
    recorded_at_ms INTEGER NOT NULL,
    -- blake3 chain hash: H(previous hash, canonical row bytes).
    hash           BLOB    NOT NULL
) STRICT;
CREATE INDEX events_by_invocation ON events (invocation_id, seq);

-- Identity and bound facts of each invocation. Written once at acceptance/preflight;
-- the status lives in the events.
CREATE TABLE invocations (
    id               TEXT    PRIMARY KEY,
    accepted_seq     INTEGER NOT NULL,
    accepted_at_ms   INTEGER NOT NULL,
    channel          TEXT    NOT NULL,
    target           TEXT    NOT NULL,
    session_id       TEXT,
    idempotency_key  TEXT
) STRICT;
CREATE INDEX invocations_by_key ON invocations (target, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- One active attempt per invocation. A holder whose lease expired is stopped by the
-- generation check inside the DISPATCH_STARTED transaction.
CREATE TABLE leases (
    invocation_id  TEXT    PRIMARY KEY,
    generation     INTEGER NOT NULL,
    holder         TEXT    NOT NULL,
    expires_at_ms  INTEGER NOT NULL
) STRICT;

-- Settled results, readable again without re-execution.
CREATE TABLE results (
    id             TEXT    PRIMARY KEY,
    invocation_id  TEXT    NOT NULL,
    generation     INTEGER NOT NULL,
    -- Non-secret facts (status, filtered headers, exit status, stream completeness).
    meta           TEXT    NOT NULL,
    -- blake3 over every stream, framed; checked on read.
    digest         TEXT    NOT NULL,
    -- Set in the same transaction as the last chunk: the completeness marker.
    complete       INTEGER NOT NULL
) STRICT;
CREATE INDEX results_by_invocation ON results (invocation_id, generation);

CREATE TABLE result_chunks (
    result_id  TEXT    NOT NULL,
    stream     TEXT    NOT NULL,
    n          INTEGER NOT NULL,
    data       BLOB    NOT NULL,
    PRIMARY KEY (result_id, stream, n)
) STRICT;

-- Signed audit checkpoints: sequence, head hash and count, ed25519 over all three.
CREATE TABLE checkpoints (
    seq        INTEGER PRIMARY KEY,
    head       BLOB    NOT NULL,
    count      INTEGER NOT NULL,
    public_key BLOB    NOT NULL,
    signature  BLOB    NOT NULL,
    made_at_ms INTEGER NOT NULL
) STRICT;
