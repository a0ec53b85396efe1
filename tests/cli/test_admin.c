/*
 * tests/cli/test_admin.c: the library calls behind idemctl, where a test
 * clock is needed: a reconciliation row stays recorded after its
 * idempotency record expired and was purged (the recon_rows backstop), the
 * purge dry run counts exactly what purge deletes, and the stats flusher
 * writes only deltas, one row per type and outcome, and carries them over.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/admin.h"
#include "support.h"

typedef struct {
	char *url;
	test_clock clock;
	idem_store *store;
	idem_pay *pay;
} fixture;

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));
	char secret[IDEM_PAY_SECRET_SIZE];

	assert_non_null(f);
	f->url = test_db_url();
	f->store = test_store_open(f->url, &f->clock);
	assert_int_equal(idem_pay_open(&f->pay, f->store, NULL), 0);
	assert_int_equal(idem_pay_channel_add(f->pay, "wx", secret), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fixture *f = *state;

	idem_pay_close(f->pay);
	idem_store_close(f->store);
	test_db_drop(f->url);
	free(f->url);
	free(f);
	return 0;
}

static const char csv[] = IDEM_RECON_HEADER "\n"
                                            "T-1,m_1,O-1,100,CNY,SUCCESS,2026-10-01T10:00:00Z\n"
                                            "T-2,m_1,O-2,200,CNY,FAILED,2026-10-01T10:00:00Z\n"
                                            "T-3,m_1,O-3,300,CNY,SUCCESS,2026-10-01T10:00:00Z\n";

static void import(fixture *f, idem_recon_report *rep)
{
	FILE *in = fmemopen((void *)csv, sizeof(csv) - 1, "r");

	assert_non_null(in);
	assert_int_equal(idem_recon_import(rep, f->pay, "wx", in, NULL), 0);
	fclose(in);
}

static void test_recorded_rows_survive_purged_records(void **state)
{
	fixture *f = *state;
	idem_recon_report rep;
	int64_t n = 0;

	import(f, &rep);
	assert_int_equal(rep.rows, 3);
	assert_int_equal(rep.inserted, 3);
	assert_int_equal(rep.missing_local, 3);
	/* The "recon" records expire (30 days) and are purged... */
	test_clock_advance(&f->clock, 31LL * 24 * 3600 * 1000);
	assert_int_equal(idem_admin_purge_count(f->store, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(idem_store_purge(f->store, 2, 0, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(idem_admin_purge_count(f->store, &n), 0);
	assert_int_equal(n, 0);
	/* ...the rows are still recorded: nothing is inserted twice. */
	import(f, &rep);
	assert_int_equal(rep.rows, 3);
	assert_int_equal(rep.inserted, 0);
	assert_int_equal(rep.duplicates, 3);
}

static void test_unknown_channel_and_bad_opts(void **state)
{
	fixture *f = *state;
	idem_recon_report rep;
	idem_recon_opts o = IDEM_RECON_OPTS_INIT;
	FILE *in = fmemopen((void *)csv, sizeof(csv) - 1, "r");

	assert_non_null(in);
	assert_int_equal(idem_recon_import(&rep, f->pay, "nosuch", in, NULL), IDEM_EINVAL);
	o.max_in_flight = 0;
	assert_int_equal(idem_recon_import(&rep, f->pay, "wx", in, &o), IDEM_EINVAL);
	assert_int_equal(rep.rows, 0);
	fclose(in);
}

static int ok_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	(void)txn;
	(void)ctx;
	return idem_response_set(resp, 200, "{}", 2);
}

static void claim(fixture *f, const char *type, const char *key)
{
	idem_request req = IDEM_REQUEST_INIT;
	idem_result res;
	char fp[65];

	test_fp(fp, "{}");
	req.scope = "m_stats";
	req.business_type = type;
	req.key = key;
	req.key_len = strlen(key);
	req.fingerprint = fp;
	memset(&res, 0, sizeof(res));
	assert_int_equal(idem_execute(&res, f->store, &req, ok_work, NULL), 0);
	idem_result_clear(&res);
}

static void test_flusher_writes_deltas(void **state)
{
	fixture *f = *state;
	idem_stats_flusher_opts o = IDEM_STATS_FLUSHER_OPTS_INIT;
	idem_stats_flusher *fl = NULL;
	idem_stats_report r;

	o.interval_ms = 3600000; /* only the explicit flushes below */
	assert_int_equal(idem_stats_flusher_start(&fl, f->store, &o), 0);
	assert_true(strncmp(idem_stats_flusher_instance(fl), "i_", 2) == 0);
	claim(f, "payment", "a");
	claim(f, "payment", "a"); /* replay */
	claim(f, "refund", "b");
	test_clock_advance(&f->clock, 1000);
	assert_int_equal(idem_stats_flusher_flush(fl), 0);
	claim(f, "payment", "c");
	test_clock_advance(&f->clock, 1000);
	assert_int_equal(idem_stats_flusher_flush(fl), 0);
	assert_int_equal(idem_stats_flusher_flush(fl), 0); /* nothing new: no rows */

	assert_int_equal(idem_stats_read(&r, f->store, 60000), 0);
	assert_int_equal(r.requests, 4);
	assert_int_equal(r.duplicates, 1);
	assert_int_equal(r.instances, 1);
	assert_int_equal(r.ntypes, 2); /* ordered by type */
	assert_string_equal(r.types[0].business_type, "payment");
	assert_int_equal(r.types[0].outcomes[IDEM_FIRST], 2);
	assert_int_equal(r.types[0].outcomes[IDEM_REPLAY], 1);
	assert_int_equal(r.types[0].succeeded, 2);
	assert_string_equal(r.types[1].business_type, "refund");
	assert_int_equal(r.types[1].outcomes[IDEM_FIRST], 1);
	idem_stats_report_clear(&r);
	/* Only the last interval (ended 0 s ago, started 1 s before) in a 500 ms window. */
	assert_int_equal(idem_stats_read(&r, f->store, 500), 0);
	assert_int_equal(r.requests, 1);
	idem_stats_report_clear(&r);
	assert_int_equal(idem_stats_read(&r, f->store, 0), IDEM_EINVAL);
	idem_stats_report_clear(&r);
	idem_stats_flusher_stop(fl);
	idem_stats_flusher_stop(NULL);
}

/* Counters past their retention are deleted; recent ones stay. */
static void test_stats_prune(void **state)
{
	fixture *f = *state;
	idem_stats_flusher_opts o = IDEM_STATS_FLUSHER_OPTS_INIT;
	idem_stats_flusher *fl = NULL;
	idem_stats_report r;
	int64_t deleted = -1;

	o.interval_ms = 3600000;
	assert_int_equal(idem_stats_flusher_start(&fl, f->store, &o), 0);
	claim(f, "payment", "old");
	test_clock_advance(&f->clock, 1000);
	assert_int_equal(idem_stats_flusher_flush(fl), 0);
	test_clock_advance(&f->clock, 10LL * 86400 * 1000); /* ten days on */
	claim(f, "payment", "new");
	test_clock_advance(&f->clock, 1000);
	assert_int_equal(idem_stats_flusher_flush(fl), 0);
	idem_stats_flusher_stop(fl);
	assert_int_equal(idem_stats_prune(f->store, 7LL * 86400 * 1000, &deleted), 0);
	assert_int_equal(deleted, 1);
	assert_int_equal(idem_stats_read(&r, f->store, 30LL * 86400 * 1000), 0);
	assert_int_equal(r.requests, 1); /* only the recent interval is left */
	idem_stats_report_clear(&r);
	assert_int_equal(idem_stats_prune(f->store, 0, NULL), IDEM_EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_recorded_rows_survive_purged_records, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(test_unknown_channel_and_bad_opts, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_flusher_writes_deltas, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_stats_prune, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
