-- Forge integration: repositories discovered on forges, their webhooks, pull request
-- evaluations, webhook replay protection and the commit-status outbox.

-- The GitHub App installation that can act on a repository (NULL elsewhere), and the id of the
-- webhook registered on it when its project was enabled (Gitea), so disabling removes it.
ALTER TABLE repositories ADD COLUMN installation_id BIGINT;
ALTER TABLE repositories ADD COLUMN hook_id TEXT;

-- An evaluation of a pull request's head records the pull request and its author (the author
-- may rebuild it; the UI lists pull requests).
ALTER TABLE evaluations ADD COLUMN pr_number INT CHECK (pr_number > 0);
ALTER TABLE evaluations ADD COLUMN pr_author TEXT;

-- Commit statuses. last_status is the combined status the evaluation should show on its
-- commit; a frontend that changes it (UPDATE ... WHERE last_status IS DISTINCT FROM ...) is the
-- one that reports it. reported_status is what the forge has been told. report_owner holds the
-- delivery lease until report_lease_until, so one frontend delivers an evaluation's statuses at
-- a time and a dead one's deliveries are taken over. A failed delivery waits until
-- report_next_attempt (backoff by report_attempts).
ALTER TABLE evaluations ADD COLUMN reported_status TEXT;
ALTER TABLE evaluations ADD COLUMN report_owner TEXT;
ALTER TABLE evaluations ADD COLUMN report_lease_until TIMESTAMPTZ;
ALTER TABLE evaluations ADD COLUMN report_attempts INT NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN report_next_attempt TIMESTAMPTZ;
-- Evaluations whose statuses the forge has not been told yet: the retry sweep reads these.
CREATE INDEX evaluations_report_behind_idx ON evaluations (report_next_attempt)
    WHERE reported_status IS DISTINCT FROM last_status;
-- A restarted frontend frees the deliveries its previous process held.
CREATE INDEX evaluations_report_owner_idx ON evaluations (report_owner) WHERE report_owner IS NOT NULL;
-- Evaluations whose statuses are not final yet: the reconciliation sweep recomputes these.
ALTER TABLE evaluations ADD COLUMN report_final BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX evaluations_report_open_idx ON evaluations (id) WHERE NOT report_final;

-- Webhook deliveries acted on, by the forge's delivery id: a replayed delivery is a no-op
-- (a replayed "/ci run" must not approve a pull request's newer head).
CREATE TABLE webhook_deliveries (
    forge       TEXT NOT NULL,
    delivery_id TEXT NOT NULL,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    eval_id     BIGINT REFERENCES evaluations(id) ON DELETE SET NULL,
    PRIMARY KEY (forge, delivery_id)
);
CREATE INDEX webhook_deliveries_received_idx ON webhook_deliveries (received_at);
