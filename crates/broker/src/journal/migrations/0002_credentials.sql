-- Credential metadata: the non-secret facts the broker keeps about each credential.
-- The secret bytes live only in the OS keychain, under the entry named by `version`;
-- nothing in this table is derived from them.
CREATE TABLE credentials (
    -- Operator-chosen name, restricted so it can be embedded in keychain entry names.
    id              TEXT    NOT NULL PRIMARY KEY
                            CHECK (length(id) BETWEEN 1 AND 128
                                   AND id NOT GLOB '*[^A-Za-z0-9._-]*'),
    kind            TEXT    NOT NULL
                            CHECK (kind IN ('token', 'ssh_key', 'signing_key')),
    -- Random tag of the keychain entry holding the current secret (`v<n>-<8 hex>`).
    version         TEXT    NOT NULL
                            CHECK (version GLOB 'v[1-9]*-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'),
    created_at_ms   INTEGER NOT NULL,
    -- When the current version was written; equal to created_at_ms until the first rotation.
    rotated_at_ms   INTEGER NOT NULL,
    last_used_at_ms INTEGER
) STRICT, WITHOUT ROWID;
