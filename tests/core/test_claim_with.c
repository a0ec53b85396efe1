/*
 * tests/core/test_claim_with.c: the two calls connected channels rely on.
 * idem_claim_begin_with commits business rows with the PROCESSING claim (a
 * payment's out_trade_no exists before the channel call), or ends the
 * request at once with an answer, stored or not; idem_record_settle lets a
 * sweeper complete a claim whose owner died, never one still leased. On
 * every backend (IDEM_TEST_URL).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

typedef struct {
	char *url;
	test_clock clock;
	idem_store *store;
	char scope[40];
	char fp[65];
} fixture;

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));

	f->url = test_db_url();
	f->store = test_store_open(f->url, &f->clock);
	test_scope(f->scope);
	test_create_work_log(f->store);
	test_fp(f->fp, "{\"amount\":1}");
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fixture *f = *state;

	idem_store_close(f->store);
	test_db_drop(f->url);
	free(f->url);
	free(f);
	return 0;
}

typedef struct {
	const char *scope, *key;
	int status, persist, fail;
} prep;

/* Log a row; answer status (0: keep the claim), or fail after the write. */
static int prep_fn(idem_txn *txn, void *ctx, idem_response *resp)
{
	prep *p = ctx;
	idem_value v[3] = {IDEM_V_TEXT(p->scope), IDEM_V_TEXT(p->key), IDEM_V_INT(1)};
	int rc = idem_txn_exec(txn, "INSERT INTO work_log (scope, k, worker) VALUES (?, ?, ?)", v,
	                       3, NULL);

	if (rc < 0)
		return rc;
	if (p->fail)
		return IDEM_ECONSTRAINT;
	if (p->status) {
		if ((rc = idem_response_set(resp, p->status, "{\"x\":1}", 7)) < 0)
			return rc;
		resp->persist = p->persist;
	}
	return 0;
}

static idem_request req(fixture *f, const char *key)
{
	idem_request r = IDEM_REQUEST_INIT;

	r.scope = f->scope;
	r.business_type = "payment";
	r.key = key;
	r.key_len = strlen(key);
	r.fingerprint = f->fp;
	r.lease_ms = 1000;
	return r;
}

static int answer_201(idem_txn *txn, void *ctx, idem_response *resp)
{
	(void)txn;
	(void)ctx;
	return idem_response_set(resp, 201, "{\"done\":1}", 10);
}

/* Held: the row and the PROCESSING claim commit together. */
static void held_claim_keeps_rows(void **state)
{
	fixture *f = *state;
	idem_request r = req(f, "H1");
	prep p = {f->scope, "H1", 0, 1, 0};
	idem_claim *c = NULL, *c2 = NULL;
	idem_result res = {0};

	assert_int_equal(idem_claim_begin_with(&c, &res, f->store, &r, prep_fn, &p), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_non_null(c);
	assert_int_equal(test_work_count(f->store, f->scope, "H1"), 1);
	idem_result_clear(&res);
	/* A duplicate meanwhile: in progress, prep not run again. */
	assert_int_equal(idem_claim_begin_with(&c2, &res, f->store, &r, prep_fn, &p), 0);
	assert_int_equal(res.outcome, IDEM_IN_PROGRESS);
	assert_null(c2);
	assert_int_equal(test_work_count(f->store, f->scope, "H1"), 1);
	idem_result_clear(&res);
	assert_int_equal(idem_claim_finish(&res, c, answer_201, NULL), 0);
	idem_result_clear(&res);
	idem_claim_free(c);
	assert_int_equal(idem_claim_begin_with(&c2, &res, f->store, &r, prep_fn, &p), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	assert_int_equal(res.http_status, 201);
	idem_result_clear(&res);
}

/* An answer from prep ends the request: stored, or rolled back with its rows. */
static void prep_answers(void **state)
{
	fixture *f = *state;
	idem_request r = req(f, "A1");
	prep p = {f->scope, "A1", 409, 1, 0};
	idem_claim *c = NULL;
	idem_result res = {0};

	assert_int_equal(idem_claim_begin_with(&c, &res, f->store, &r, prep_fn, &p), 0);
	assert_null(c);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_int_equal(res.http_status, 409);
	assert_int_equal(res.stored, 1);
	idem_result_clear(&res);
	assert_int_equal(idem_claim_begin_with(&c, &res, f->store, &r, prep_fn, &p), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	assert_int_equal(res.http_status, 409);
	assert_int_equal(test_work_count(f->store, f->scope, "A1"), 1);
	idem_result_clear(&res);

	r = req(f, "A2");
	p = (prep){f->scope, "A2", 404, 0, 0};
	assert_int_equal(idem_claim_begin_with(&c, &res, f->store, &r, prep_fn, &p), 0);
	assert_null(c);
	assert_int_equal(res.http_status, 404);
	assert_int_equal(res.stored, 0);
	assert_int_equal(test_work_count(f->store, f->scope, "A2"), 0);
	idem_result_clear(&res);
	/* Nothing kept: the next attempt is FIRST again. */
	p.status = 0;
	assert_int_equal(idem_claim_begin_with(&c, &res, f->store, &r, prep_fn, &p), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_non_null(c);
	assert_int_equal(idem_claim_abort(c), 0);
	idem_claim_free(c);
	idem_result_clear(&res);
}

/* A failing prep leaves nothing: no claim, no row. */
static void prep_error_rolls_back(void **state)
{
	fixture *f = *state;
	idem_request r = req(f, "E1");
	prep p = {f->scope, "E1", 0, 1, 1};
	idem_claim *c = NULL;
	idem_result res = {0};
	idem_record_info info = {0};

	assert_true(idem_claim_begin_with(&c, &res, f->store, &r, prep_fn, &p) < 0);
	assert_null(c);
	idem_result_clear(&res);
	assert_int_equal(test_work_count(f->store, f->scope, "E1"), 0);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "E1", 2),
	                 IDEM_ENOTFOUND);
}

typedef struct {
	fixture *f;
	const char *key;
	int settled;
} settle_ctx;

static int settle_fn(idem_txn *txn, void *ctx)
{
	settle_ctx *s = ctx;

	return idem_record_settle(txn, s->f->scope, "payment", s->key, strlen(s->key), 201,
	                          "{\"settled\":1}", 13, &s->settled);
}

/* Settling: never a live lease; an expired one is completed once. */
static void settle_only_after_the_lease(void **state)
{
	fixture *f = *state;
	idem_request r = req(f, "S1");
	prep p = {f->scope, "S1", 0, 1, 0};
	idem_claim *c = NULL;
	idem_result res = {0};
	settle_ctx s = {f, "S1", 0};

	assert_int_equal(idem_claim_begin_with(&c, &res, f->store, &r, prep_fn, &p), 0);
	assert_non_null(c);
	idem_result_clear(&res);
	assert_int_equal(idem_store_transact(f->store, settle_fn, &s), 0);
	assert_int_equal(s.settled, 0); /* the owner is alive */
	test_clock_advance(&f->clock, 1500);
	assert_int_equal(idem_store_transact(f->store, settle_fn, &s), 0);
	assert_int_equal(s.settled, 1);
	assert_int_equal(idem_store_transact(f->store, settle_fn, &s), 0);
	assert_int_equal(s.settled, 0); /* completed already */
	/* The owner comes back late: its answer is not stored. */
	assert_int_equal(idem_claim_complete(c, 201, "{\"late\":1}", 10), IDEM_ELEASE);
	idem_claim_free(c);
	assert_int_equal(idem_claim_begin_with(&c, &res, f->store, &r, prep_fn, &p), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	assert_int_equal(res.body_len, 13);
	assert_memory_equal(res.body, "{\"settled\":1}", 13);
	idem_result_clear(&res);
	/* No record at all: nothing to settle, no error. */
	s.key = "nothing-here";
	assert_int_equal(idem_store_transact(f->store, settle_fn, &s), 0);
	assert_int_equal(s.settled, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(held_claim_keeps_rows, setup, teardown),
	    cmocka_unit_test_setup_teardown(prep_answers, setup, teardown),
	    cmocka_unit_test_setup_teardown(prep_error_rolls_back, setup, teardown),
	    cmocka_unit_test_setup_teardown(settle_only_after_the_lease, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
