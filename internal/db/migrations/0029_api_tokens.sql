-- Tokens of the HTTP API (Authorization: Bearer). A user mints personal ones in the web UI: the
-- token is that user (forge, numeric user id, and the login the forge's permission API is asked
-- with), and may do what their session may. An admin mints machine tokens with `harmonia-ci
-- api-token`: no user; either admin (as the admin token) or reading the projects named. Only the
-- token's sha256 is stored; revoked tokens are kept so the list says what was. Cache tokens are
-- another table: neither kind is looked up where the other is expected.
CREATE TABLE api_tokens (
    id           BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    token_hash   BYTEA NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    name         TEXT NOT NULL,
    forge        TEXT,
    user_id      BIGINT CHECK (user_id > 0),
    login        TEXT,
    admin        BOOLEAN NOT NULL DEFAULT false,
    project_ids  BIGINT[] NOT NULL DEFAULT '{}',
    expires_at   TIMESTAMPTZ NOT NULL,
    revoked_at   TIMESTAMPTZ,
    last_used_at TIMESTAMPTZ,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT api_tokens_owner_check CHECK (
        (forge IS NOT NULL AND user_id IS NOT NULL AND login IS NOT NULL AND NOT admin AND project_ids = '{}')
        OR (forge IS NULL AND user_id IS NULL AND login IS NULL))
);

CREATE INDEX api_tokens_user_idx ON api_tokens (forge, user_id) WHERE user_id IS NOT NULL;

-- The writes users and tokens make through the HTTP API and the UI (rebuild, cancel, ...; the
-- admins' project settings): who (a session's or a token's user, or a machine token; token_id
-- and token_name when through a token, kept if the token goes), what (the action and the build
-- job, evaluation or repository it touched), when (the database's clock). The build and
-- evaluation pages show theirs.
CREATE TABLE action_log (
    id         BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    action     TEXT NOT NULL,
    job_id     BIGINT,
    eval_id    BIGINT,
    repo_id    BIGINT,
    actor      TEXT NOT NULL,
    token_id   BIGINT,
    token_name TEXT,
    message    TEXT NOT NULL DEFAULT '',
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (num_nonnulls(job_id, eval_id, repo_id) = 1)
);

CREATE INDEX action_log_job_idx ON action_log (job_id, id) WHERE job_id IS NOT NULL;
CREATE INDEX action_log_eval_idx ON action_log (eval_id, id) WHERE eval_id IS NOT NULL;
