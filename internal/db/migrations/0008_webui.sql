-- The web UI's dashboard charts read the build jobs active in the last hours: this index finds
-- them without scanning the table's whole history (the expression is the charts' filter).
CREATE INDEX build_jobs_activity_idx ON build_jobs ((GREATEST(created_at, claimed_at, finished_at)));
-- A project page lists its evaluations newest first, by keyset.
CREATE INDEX evaluations_project_id_idx ON evaluations (project_id, id DESC);
