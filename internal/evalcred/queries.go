package evalcred

// All SQL of the evaluation credential endpoint.

const (
	// The repository of an evaluation that is running under the claim ($1 id, $2 node,
	// $3 attempt), or of which the node walks a unit at that attempt (it helps the claimant):
	// no row for a finished, queued or reassigned one.
	sqlClaimedRepository = `
SELECT p.repo_id FROM evaluations e JOIN projects p ON p.id = e.project_id
WHERE e.id = $1 AND e.attempt = $3 AND e.status = 'running'
  AND (e.claimed_by = $2
       OR EXISTS (SELECT 1 FROM eval_units u
                  WHERE u.eval_id = e.id AND u.eval_attempt = e.attempt
                    AND u.claimed_by = $2 AND u.status = 'running'))`

	// The credential moved out of the URL of repository $1 (added by URL before credentials
	// in URLs were refused); no row for any other.
	sqlStoredCredential = `
SELECT username, password FROM repository_credentials WHERE repo_id = $1`
)
