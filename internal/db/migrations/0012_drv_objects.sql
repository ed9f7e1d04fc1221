-- The binary cache's .drv objects, kept in PostgreSQL instead of two blob objects (a NAR and a
-- narinfo) each: an evaluation publishes thousands of small .drv files at once, and a row is
-- far cheaper to write than two files or two S3 objects. Written only by the signer, which
-- checked the text against the store path and signed the narinfo; served by cache nodes as
-- <hash_part>.narinfo and nar/<nar_hash>.nar (uncompressed, rendered from drv); swept by the
-- garbage collector like any cache object.
CREATE TABLE drv_objects (
    hash_part  TEXT PRIMARY KEY,            -- the store path's hash part: <hash_part>.narinfo
    store_path TEXT NOT NULL,
    nar_hash   TEXT NOT NULL,               -- nix32 sha256 of the NAR: nar/<nar_hash>.nar
    nar_size   BIGINT NOT NULL CHECK (nar_size > 0),
    narinfo    TEXT NOT NULL,               -- as served, signed
    drv        BYTEA NOT NULL,              -- the .drv file's contents
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX drv_objects_nar_hash_idx ON drv_objects (nar_hash);
