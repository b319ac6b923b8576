-- The RFC 6962 Merkle tree over the events (see audit/merkle.rs): the hashes the tree
-- stores, at the indexes tlog's stored_hash_index gives. Derived from the events and
-- written in the same transaction; verification recomputes it rather than trusting it.
CREATE TABLE merkle (
    idx   INTEGER PRIMARY KEY,
    hash  BLOB    NOT NULL
) STRICT;

-- Checkpoints now also sign the tree's root, and carry it as a C2SP signed note.
ALTER TABLE checkpoints ADD COLUMN root BLOB;
ALTER TABLE checkpoints ADD COLUMN note TEXT;

-- Witnesses' cosignatures of checkpoints (c2sp.org/tlog-cosignature), with the note
-- they cosigned, so they stand on their own when older checkpoints are replaced.
CREATE TABLE cosignatures (
    size            INTEGER NOT NULL,
    witness         TEXT    NOT NULL,
    note            TEXT    NOT NULL,
    signature       TEXT    NOT NULL,
    received_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (size, witness)
) STRICT;
