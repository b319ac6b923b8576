-- The secret-free summary of each invocation (method and URL, or host and command), so
-- the activity view can search target and URL without folding every invocation. Rows
-- written before this migration have NULL and are matched by folding their events.
ALTER TABLE invocations ADD COLUMN summary TEXT;
