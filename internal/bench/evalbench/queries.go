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
)
