-- An evaluation's interest in a build job: the job is its attribute's derivation or in that
-- derivation's closure, the evaluation is live (queued, running, succeeded or skipped), and the
-- attribute is not detached. A user who may act on some but not all of the evaluations
-- interested in a job cannot cancel it for everyone: their cancel detaches their evaluations'
-- attributes that need the job (detached_at), and the job goes on for the others. A detached
-- attribute counts as cancelled for its evaluation and no longer keeps a pending job needed.
-- A re-evaluation writes its attributes afresh, interested again.
ALTER TABLE eval_attrs ADD COLUMN detached_at TIMESTAMPTZ;
