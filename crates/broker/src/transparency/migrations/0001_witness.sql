-- A witness's state (c2sp.org/tlog-witness): which logs it serves, the latest
-- checkpoint it cosigned for each, and the submissions it refused that may prove a log
-- misbehaved. Its private key is not here: it lives in `witness.key` (0600).

-- The witness's own settings: `name` is its key name (the cosignature key name).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

-- Logs this witness cosigns for, keyed by checkpoint origin.
CREATE TABLE logs (
    origin   TEXT PRIMARY KEY,
    -- The log's signed-note verifier key (`name+id+base64(0x01 || key)`).
    vkey     TEXT NOT NULL,
    added_at INTEGER NOT NULL  -- POSIX seconds
) STRICT;

-- The latest checkpoint cosigned per origin. Replaced in the same transaction that
-- checked the submission against it, so two submissions can never roll it back.
CREATE TABLE latest (
    origin      TEXT PRIMARY KEY REFERENCES logs(origin),
    size        INTEGER NOT NULL CHECK (size >= 0),
    root        BLOB NOT NULL CHECK (length(root) = 32),
    -- The checkpoint text, a blank line and the log's verified signature lines.
    note        BLOB NOT NULL,
    -- Our cosignature line on it, newline-terminated.
    cosignature BLOB NOT NULL,
    cosigned_at INTEGER NOT NULL  -- POSIX seconds, the cosignature's timestamp
) STRICT;

-- Submissions correctly signed by a known log that were refused because they would
-- roll back or fork what was cosigned: evidence of log misbehavior (tlog-witness,
-- add-checkpoint: "MAY log the request ... as it might be proof of log misbehavior").
CREATE TABLE refusals (
    id          INTEGER PRIMARY KEY,
    origin      TEXT NOT NULL,
    at          INTEGER NOT NULL,  -- POSIX seconds
    status      INTEGER NOT NULL,  -- the HTTP status answered
    reason      TEXT NOT NULL,     -- old_exceeds_size | inconsistent | equivocation
    old_size    INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    root        BLOB NOT NULL,
    -- The whole request body as received (old line, proof, signed note).
    request     BLOB NOT NULL
) STRICT;

CREATE INDEX refusals_by_origin ON refusals(origin, id);
