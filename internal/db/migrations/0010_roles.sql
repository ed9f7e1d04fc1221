-- The readiness triggers keep blocked_inputs of jobs other than the row being changed: a
-- signer's success unblocks dependents, an evaluator's insert recounts referrers, a GC delete
-- unblocks what the deleted job held. With per-role database roles (`harmonia-ci db roles`)
-- none of those roles may write other jobs' blocked_inputs, so the triggers run as the schema
-- owner (who bypasses row-level security). For the default single-owner setup this changes
-- nothing. The search_path is pinned to the schema the tables live in, with pg_temp last, so a
-- caller's temporary tables cannot stand in for ours.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION build_jobs_after_insert() SECURITY DEFINER SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION build_jobs_after_status() SECURITY DEFINER SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION build_jobs_after_delete() SECURITY DEFINER SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION derivation_inputs_after_change() SECURITY DEFINER SET search_path = %I, pg_temp', current_schema());
END
$$;
