-- Read-only tokens of the binary cache (issue 27): an admin mints one for a set of projects
-- (`harmonia-ci cache-token`), with an expiry; a Nix client sends it as its netrc password (HTTP
-- basic auth) or as a bearer token, and reads those projects' private store paths. Only the
-- token's sha256 is stored. Revoked tokens are kept (revoked_at) so the list says what was.
CREATE TABLE cache_tokens (
    id          BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    token_hash  BYTEA NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    note        TEXT NOT NULL DEFAULT '',
    project_ids BIGINT[] NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    revoked_at  TIMESTAMPTZ,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The cache asks which projects have a store path by its hash part (cache.sqlPathProjects):
-- outputs by the 32 characters after "/nix/store/".
CREATE INDEX derivation_outputs_hash_part_idx ON derivation_outputs (substr(output_path, 12, 32));
