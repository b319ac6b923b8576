-- Invocations the broker starts for another one (a followed redirect, a job, a job
-- poll, a reconcile query) name it in their ACTION_ACCEPTED; these columns copy that
-- link so a record can list its children by index. The events remain the truth.
ALTER TABLE invocations ADD COLUMN parent_id TEXT;
ALTER TABLE invocations ADD COLUMN relation TEXT;
CREATE INDEX invocations_by_parent ON invocations (parent_id, accepted_seq)
    WHERE parent_id IS NOT NULL;
