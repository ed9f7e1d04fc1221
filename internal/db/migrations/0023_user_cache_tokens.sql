-- Cache tokens a user mints for themself in the web UI: the token carries its user's forge
-- permissions. The frontend records who (forge and numeric user id; the login is what the
-- forge's permission API is asked with, and is checked to still be theirs) and the projects
-- they may read; a frontend leader task recomputes those from the forge every few minutes
-- (refreshed_at), so a permission the forge takes back stops the token within that interval.
-- Admin tokens (harmonia-ci cache-token) have no user: forge, user_id and login are NULL.
ALTER TABLE cache_tokens
    ADD COLUMN forge        TEXT,
    ADD COLUMN user_id      BIGINT CHECK (user_id > 0),
    ADD COLUMN login        TEXT,
    ADD COLUMN refreshed_at TIMESTAMPTZ,
    ADD CONSTRAINT cache_tokens_user_check CHECK (
        (forge IS NULL AND user_id IS NULL AND login IS NULL)
        OR (forge IS NOT NULL AND user_id IS NOT NULL AND login IS NOT NULL AND refreshed_at IS NOT NULL));

CREATE INDEX cache_tokens_user_idx ON cache_tokens (forge, user_id) WHERE user_id IS NOT NULL;
