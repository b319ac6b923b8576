-- The request an invocation was accepted with, so a retry re-sends exactly it (and is
-- checked against the bound fingerprint) without the agent re-submitting. Holds the
-- agent's own request data only; the broker's credential is injected at dispatch and
-- never stored.
CREATE TABLE requests (
    invocation_id TEXT PRIMARY KEY,
    -- JSON: method, url, headers, query, idempotency key, timeout.
    meta          TEXT NOT NULL,
    body          BLOB NOT NULL
) STRICT;
