-- The retention policy of stored results (see journal/results.rs): when each result was
-- stored and how many bytes its chunks hold, so the pruning pass can expire the oldest
-- first by age and by total size without reading the chunks. Results stored before this
-- migration take the time of their RESULT_COMMITTED event. Idempotent, like the
-- migrations before it: a journal whose version was rolled back runs it again.
CREATE TABLE IF NOT EXISTS result_retention (
    result_id        TEXT    PRIMARY KEY,
    committed_at_ms  INTEGER NOT NULL,
    bytes            INTEGER NOT NULL
) STRICT;
INSERT OR IGNORE INTO result_retention (result_id, committed_at_ms, bytes)
SELECT r.id,
       COALESCE((SELECT max(e.recorded_at_ms) FROM events e
                 WHERE e.invocation_id = r.invocation_id AND e.kind = 'RESULT_COMMITTED'), 0),
       COALESCE((SELECT sum(length(c.data)) FROM result_chunks c WHERE c.result_id = r.id), 0)
FROM results r;
CREATE INDEX IF NOT EXISTS result_retention_by_age ON result_retention (committed_at_ms);
