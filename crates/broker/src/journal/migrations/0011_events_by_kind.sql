-- Journal events of one kind, newest first, by index: the console lists the incidents
-- of calls through peer brokers (PEER_INCIDENT) without reading every event.
CREATE INDEX IF NOT EXISTS events_by_kind ON events (kind, seq);
