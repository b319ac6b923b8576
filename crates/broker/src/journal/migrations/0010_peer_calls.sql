-- Calls a federated peer broker made to this one (journal/peer_calls.rs): which
-- invocation here runs the peer's call, so a repeated call (after a timeout, a reset,
-- or a restart of either broker) is answered from that invocation's record instead of
-- being run again. Written in the same transaction as the invocation's
-- ACTION_ACCEPTED. Holds ids and digests only, never request data or secrets.
-- Idempotent, like the migrations before it: a journal whose version was rolled back
-- runs it again.
CREATE TABLE IF NOT EXISTS peer_calls (
    -- The asking broker's key name (its audit log origin).
    asker               TEXT    NOT NULL,
    -- The asking broker's invocation id for the call.
    caller_invocation   TEXT    NOT NULL,
    -- The invocation here that runs it.
    invocation_id       TEXT    NOT NULL,
    capability          TEXT    NOT NULL,
    -- The peer request's fingerprint, as this broker computed it from what it received.
    request_fingerprint TEXT    NOT NULL,
    -- The export policy version the call was accepted under (what its answers attest).
    policy_version      TEXT    NOT NULL,
    accepted_at_ms      INTEGER NOT NULL,
    PRIMARY KEY (asker, caller_invocation)
) STRICT;
CREATE INDEX IF NOT EXISTS peer_calls_by_invocation ON peer_calls (invocation_id);
