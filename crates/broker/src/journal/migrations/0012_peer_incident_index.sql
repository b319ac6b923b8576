-- The console lists the incidents of calls through peer brokers (PEER_INCIDENT) by a
-- partial index of those events alone. An index of every event by kind cost each
-- commit one more page per kind it wrote (eight or so), for one query that reads one
-- kind.
DROP INDEX IF EXISTS events_by_kind;
CREATE INDEX IF NOT EXISTS events_peer_incidents ON events (seq) WHERE kind = 'PEER_INCIDENT';
