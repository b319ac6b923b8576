-- The retention policy of stored results (see journal/results.rs): when each result was
-- stored and how many bytes its chunks hold, so the pruning pass can expire the oldest
-- first by age and by total size without reading the chunks. Results stored before this
-- migration take the time of their RESULT_COMMITTED event.
ALTER TABLE results ADD COLUMN committed_at_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
UPDATE results SET
    committed_at_ms = COALESCE((SELECT max(e.recorded_at_ms) FROM events e
                                WHERE e.invocation_id = results.invocation_id
                                  AND e.kind = 'RESULT_COMMITTED'), 0),
    bytes = COALESCE((SELECT sum(length(c.data)) FROM result_chunks c
                      WHERE c.result_id = results.id), 0);
CREATE INDEX results_by_age ON results (committed_at_ms);
