-- Webhook ingress: a secret per repository, and replays recognised by their body.

-- The forge's numeric id of a repository (recorded by discovery). Each repository's hook is
-- registered at /webhook/{forge}/{forge_id} with a secret derived from it; a delivery there is
-- acted on only for the repository row of that id. Not unique: a renamed repository is a new
-- row until the old one is cleaned up.
ALTER TABLE repositories ADD COLUMN forge_id BIGINT CHECK (forge_id > 0);

-- The base URL (PUBLIC_URL/webhook/{forge}) the repository's hook was registered for: an enabled
-- project whose hook predates per-repository secrets (NULL), or whose public URL changed, has
-- its hook registered again by the repository discovery.
ALTER TABLE repositories ADD COLUMN hook_url TEXT;

-- The SHA-256 of an acted-on delivery's signed body: the same body again is a replay whatever
-- its (unsigned) delivery id. Kept as long as the delivery row (the GC's delivery retention).
ALTER TABLE webhook_deliveries ADD COLUMN body_sha256 BYTEA CHECK (octet_length(body_sha256) = 32);
CREATE UNIQUE INDEX webhook_deliveries_body_idx ON webhook_deliveries (forge, body_sha256) WHERE body_sha256 IS NOT NULL;
