-- The nonces of federated peers' authenticated requests (journal/peer_calls.rs), kept
-- while their auth is inside the time window, so that a captured request is not
-- answered twice, even after this broker restarts. Written only after the request's
-- signature verified with a pinned key: an unauthenticated party cannot grow it.
-- Idempotent, like the migrations before it.
CREATE TABLE IF NOT EXISTS peer_nonces (
    -- The asking broker's key name (its audit log origin).
    asker         TEXT    NOT NULL,
    -- The auth's nonce, lowercase hex.
    nonce         TEXT    NOT NULL,
    -- The auth's issue time, by the asker's clock (unix ms).
    issued_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (asker, nonce)
) STRICT;
CREATE INDEX IF NOT EXISTS peer_nonces_by_time ON peer_nonces (issued_at_ms);
