package evalbench

// The benchmark's SQL, named for what it reads or writes.
const (
	// sqlDrvObjectCount counts the .drv objects recorded.
	sqlDrvObjectCount = `SELECT count(*) FROM drv_objects`

	// sqlGraphRows reads the rows an evaluation writes for its derivation graph.
	sqlGraphRows = `SELECT
	    (SELECT count(*) FROM derivations) + (SELECT count(*) FROM derivation_outputs) +
	    (SELECT count(*) FROM derivation_inputs) + (SELECT count(*) FROM eval_attrs) +
	    (SELECT count(*) FROM build_jobs),
	    (SELECT count(*) FROM build_jobs)`

	// sqlUnitsByNode counts the units each evaluator node walked.
	sqlUnitsByNode = `SELECT claimed_by, count(*) FROM eval_units WHERE status = 'done' GROUP BY claimed_by ORDER BY claimed_by`

	// sqlEvalTotals counts every evaluation's attributes, those with an error, and the
	// derivations recorded.
	sqlEvalTotals = `SELECT
	    (SELECT count(*) FROM eval_attrs),
	    (SELECT count(*) FROM eval_attrs WHERE error IS NOT NULL),
	    (SELECT count(*) FROM derivations)`
)

// The scale benchmark's SQL.
const (
	// sqlEvalShape is what evaluation $1 recorded: attributes, of which failed to evaluate,
	// and the build jobs of its attributes' closures.
	sqlEvalShape = `SELECT
	    (SELECT count(*) FROM eval_attrs WHERE eval_id = $1),
	    (SELECT count(*) FROM eval_attrs WHERE eval_id = $1 AND error IS NOT NULL),
	    (SELECT count(*) FROM build_jobs j JOIN projects p ON p.id = j.project_id
	     JOIN evaluations e ON e.project_id = p.id WHERE e.id = $1),
	    (SELECT worker_restarts FROM evaluations WHERE id = $1)`
)
