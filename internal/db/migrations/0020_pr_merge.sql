-- A pull request is evaluated as its head merged into its base (see docs/decisions.md, "Pull
-- requests evaluated as merged"). commit_sha stays the head: the statuses, the web UI's links and
-- the (project_id, commit_sha, branch) key are the head's. pr_base is the base branch the forge
-- named; the evaluator records the base's tip it merged into (or that conflicted) and the merge
-- it evaluated. All three are empty for branches and for pull requests evaluated at their head.
ALTER TABLE evaluations ADD COLUMN pr_base TEXT NOT NULL DEFAULT '';
ALTER TABLE evaluations ADD COLUMN base_commit TEXT NOT NULL DEFAULT '';
ALTER TABLE evaluations ADD COLUMN merge_commit TEXT NOT NULL DEFAULT '';
