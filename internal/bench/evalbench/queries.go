package evalbench

// The benchmark's SQL, named for what it reads or writes.
const (
	// queryDrvObjectCount counts the .drv objects recorded.
	queryDrvObjectCount = `SELECT count(*) FROM drv_objects`

	// queryGraphRows reads the rows an evaluation writes for its derivation graph.
	queryGraphRows = `SELECT
	    (SELECT count(*) FROM derivations) + (SELECT count(*) FROM derivation_outputs) +
	    (SELECT count(*) FROM derivation_inputs) + (SELECT count(*) FROM eval_attrs) +
	    (SELECT count(*) FROM build_jobs),
	    (SELECT count(*) FROM build_jobs)`
)
