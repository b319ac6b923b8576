-- The current status of each invocation, kept by the writer in the same transaction as
-- every event, so the activity views page and filter a million invocations by index
-- instead of folding each one. The events remain the truth: readers still fold the
-- rows they show, and a row whose status is NULL (written before this migration) is
-- folded to decide whether it matches.
ALTER TABLE invocations ADD COLUMN phase TEXT;
ALTER TABLE invocations ADD COLUMN outcome TEXT;
ALTER TABLE invocations ADD COLUMN code TEXT;
CREATE INDEX invocations_by_seq ON invocations (accepted_seq);
CREATE INDEX invocations_by_session ON invocations (session_id, accepted_seq);
CREATE INDEX invocations_by_target ON invocations (target, accepted_seq);
CREATE INDEX invocations_by_phase ON invocations (phase, accepted_seq);
CREATE INDEX invocations_by_outcome ON invocations (outcome, accepted_seq);
CREATE INDEX invocations_by_code ON invocations (code, accepted_seq);
