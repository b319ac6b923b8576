-- Substring search over target and summary without scanning every invocation: a
-- contentless FTS5 index with the trigram tokenizer (case-insensitive), keyed by
-- accepted_seq, so a search walks its matches newest first and stops after a page.
-- Rows from before the summary column get their summary from their ACTION_ACCEPTED event.
UPDATE invocations
SET summary = (SELECT json_extract(e.body, '$.summary') FROM events e
               WHERE e.seq = invocations.accepted_seq)
WHERE summary IS NULL;
CREATE VIRTUAL TABLE invocation_search USING fts5(text, tokenize = 'trigram', content = '');
INSERT INTO invocation_search (rowid, text)
SELECT accepted_seq, target || ' ' || coalesce(summary, '') FROM invocations;
