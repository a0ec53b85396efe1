/*
 * tests/core/test_contract.c: the claim contract every backend must keep.
 * Runs unchanged on each store (IDEM_TEST_URL picks a server backend; the
 * default is a fresh SQLite file). Every test works under its own random
 * scope, so it never sees another test's records.
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
} fixture;

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));

	f->url = test_db_url();
	f->store = test_store_open(f->url, &f->clock);
	test_scope(f->scope);
	test_create_work_log(f->store);
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

/* A unit of work: log one row, answer a fixed response. */
typedef struct {
	const char *scope, *key;
	int status;
	const void *body;
	size_t len;
	int persist;
	int calls;
	const char *bad_sql; /* run this instead of the insert, to provoke errors */
} unit;

static int unit_fn(idem_txn *txn, void *ctx, idem_response *resp)
{
	unit *u = ctx;
	idem_value p[3] = {IDEM_V_TEXT(u->scope), IDEM_V_TEXT(u->key), IDEM_V_INT(1)};
	int rc;

	u->calls++;
	rc = idem_txn_exec(txn,
	                   u->bad_sql ? u->bad_sql
	                              : "INSERT INTO work_log (scope, k, worker) VALUES (?, ?, ?)",
	                   p, u->bad_sql ? 0 : 3, NULL);
	if (rc < 0)
		return rc;
	if ((rc = idem_response_set(resp, u->status, u->body, u->len)) < 0)
		return rc;
	resp->persist = u->persist;
	return 0;
}

static idem_request req_for(const char *scope, const char *type, const char *key, const char *fp)
{
	idem_request r = IDEM_REQUEST_INIT;

	r.scope = scope;
	r.business_type = type;
	r.key = key;
	r.key_len = strlen(key);
	r.fingerprint = fp;
	return r;
}

static int exec_unit(fixture *f, const char *type, const char *key, const char *fp, unit *u,
                     idem_result *res)
{
	idem_request r = req_for(f->scope, type, key, fp);

	u->scope = f->scope;
	u->key = key;
	return idem_execute(res, f->store, &r, unit_fn, u);
}

/* FIRST runs the unit; the duplicate gets the byte-identical body without it. */
static void first_then_replay(void **state)
{
	fixture *f = *state;
	static const unsigned char body[] = "{\"id\":\"pay_1\"}\0\xff\xfe binary tail";
	unit u = {.status = 201, .body = body, .len = sizeof(body), .persist = 1};
	idem_result res = {0};
	char fp[65];

	test_fp(fp, "{\"amount\":1000}");
	assert_int_equal(exec_unit(f, "payment", "K1", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_int_equal(res.http_status, 201);
	assert_int_equal(res.stored, 1);
	assert_int_equal(u.calls, 1);
	idem_result_clear(&res);

	for (int i = 0; i < 3; i++) {
		assert_int_equal(exec_unit(f, "payment", "K1", fp, &u, &res), 0);
		assert_int_equal(res.outcome, IDEM_REPLAY);
		assert_int_equal(res.http_status, 201);
		assert_int_equal(res.body_len, sizeof(body));
		assert_memory_equal(res.body, body, sizeof(body));
		idem_result_clear(&res);
	}
	assert_int_equal(u.calls, 1);
	assert_int_equal(test_work_count(f->store, f->scope, "K1"), 1);
}

/* The duplicate is decided by the write path too, when the read path misses. */
static void replay_through_write_path(void **state)
{
	fixture *f = *state;
	unit u = {.status = 200, .body = "ok", .len = 2, .persist = 1};
	idem_result res = {0};
	idem_claim *c = NULL;
	idem_request r;
	char fp[65];

	test_fp(fp, "{}");
	r = req_for(f->scope, "payment", "K2", fp);
	/* Two-phase FIRST, completed: the record is now SUCCEEDED. */
	assert_int_equal(idem_claim_begin(&c, &res, f->store, &r), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_int_equal(idem_claim_complete(c, 200, "done", 4), 0);
	idem_claim_free(c);
	idem_result_clear(&res);
	assert_int_equal(exec_unit(f, "payment", "K2", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	assert_int_equal(res.body_len, 4);
	assert_memory_equal(res.body, "done", 4);
	assert_int_equal(u.calls, 0);
	idem_result_clear(&res);
}

static void mismatch(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "a", .len = 1, .persist = 1};
	idem_result res = {0};
	char fp1[65], fp2[65];

	test_fp(fp1, "{\"amount\":1000}");
	test_fp(fp2, "{\"amount\":2000}");
	assert_int_equal(exec_unit(f, "payment", "K", fp1, &u, &res), 0);
	idem_result_clear(&res);
	assert_int_equal(exec_unit(f, "payment", "K", fp2, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_MISMATCH);
	assert_null(res.body);
	assert_int_equal(u.calls, 1);
	idem_result_clear(&res);
}

static void stored_business_error_replays(void **state)
{
	fixture *f = *state;
	unit u = {.status = 409, .body = "{\"code\":\"insufficient_balance\"}", .persist = 1};
	idem_result res = {0};
	idem_record_info info;
	char fp[65];

	u.len = strlen(u.body);
	test_fp(fp, "{}");
	assert_int_equal(exec_unit(f, "transfer", "T1", fp, &u, &res), 0);
	idem_result_clear(&res);
	assert_int_equal(exec_unit(f, "transfer", "T1", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	assert_int_equal(res.http_status, 409);
	idem_result_clear(&res);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "transfer", "T1", 2), 0);
	assert_string_equal(info.status, "FAILED");
	assert_int_equal(info.http_status, 409);
	assert_string_equal(info.fingerprint, fp);
	idem_record_info_clear(&info);
}

/* persist=0: answered once, nothing kept; the retry runs afresh. */
static void unstored_answer_leaves_nothing(void **state)
{
	fixture *f = *state;
	unit u = {.status = 404, .body = "unknown", .len = 7, .persist = 0};
	idem_result res = {0};
	idem_record_info info;
	char fp[65];

	test_fp(fp, "{}");
	assert_int_equal(exec_unit(f, "transfer", "T2", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_int_equal(res.stored, 0);
	assert_int_equal(res.http_status, 404);
	idem_result_clear(&res);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "transfer", "T2", 2),
	                 IDEM_ENOTFOUND);
	assert_int_equal(test_work_count(f->store, f->scope, "T2"), 0);
	assert_int_equal(exec_unit(f, "transfer", "T2", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_int_equal(u.calls, 2);
	idem_result_clear(&res);
}

static void in_progress_and_takeover(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "b", .len = 1, .persist = 1};
	idem_result res = {0};
	idem_claim *c1 = NULL, *c2 = NULL;
	idem_request r;
	char fp[65];

	test_fp(fp, "{}");
	r = req_for(f->scope, "payment", "K", fp);
	r.lease_ms = 10000;
	assert_int_equal(idem_claim_begin(&c1, &res, f->store, &r), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_non_null(c1);
	idem_result_clear(&res);

	test_clock_advance(&f->clock, 4000);
	assert_int_equal(idem_claim_begin(&c2, &res, f->store, &r), 0);
	assert_int_equal(res.outcome, IDEM_IN_PROGRESS);
	assert_null(c2);
	assert_int_equal(res.retry_after_ms, 6000);
	idem_result_clear(&res);
	/* Atomic callers see the same PROCESSING record. */
	assert_int_equal(exec_unit(f, "payment", "K", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_IN_PROGRESS);
	assert_int_equal(u.calls, 0);
	idem_result_clear(&res);

	/* The owner dies; its lease runs out; the next caller takes over. */
	test_clock_advance(&f->clock, 6001);
	assert_int_equal(idem_claim_begin(&c2, &res, f->store, &r), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_non_null(c2);
	idem_result_clear(&res);
	/* The old owner wakes up: its completion must not land. */
	assert_int_equal(idem_claim_complete(c1, 201, "old", 3), IDEM_ELEASE);
	assert_int_equal(idem_claim_abort(c1), IDEM_ELEASE);
	assert_int_equal(idem_claim_complete(c2, 201, "new", 3), 0);
	idem_claim_free(c1);
	idem_claim_free(c2);

	assert_int_equal(exec_unit(f, "payment", "K", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	assert_memory_equal(res.body, "new", 3);
	idem_result_clear(&res);
}

/* A different fingerprint on a PROCESSING record is a mismatch, not "wait". */
static void mismatch_while_processing(void **state)
{
	fixture *f = *state;
	idem_result res = {0};
	idem_claim *c = NULL, *c2 = NULL;
	idem_request r;
	char fp1[65], fp2[65];

	test_fp(fp1, "{\"a\":1}");
	test_fp(fp2, "{\"a\":2}");
	r = req_for(f->scope, "payment", "K", fp1);
	assert_int_equal(idem_claim_begin(&c, &res, f->store, &r), 0);
	idem_result_clear(&res);
	r.fingerprint = fp2;
	assert_int_equal(idem_claim_begin(&c2, &res, f->store, &r), 0);
	assert_int_equal(res.outcome, IDEM_MISMATCH);
	assert_null(c2);
	idem_result_clear(&res);
	assert_int_equal(idem_claim_abort(c), 0);
	idem_claim_free(c);
}

static void extend_keeps_the_lease(void **state)
{
	fixture *f = *state;
	idem_result res = {0};
	idem_claim *c = NULL, *c2 = NULL;
	idem_request r;
	char fp[65];

	test_fp(fp, "{}");
	r = req_for(f->scope, "payment", "K", fp);
	r.lease_ms = 1000;
	assert_int_equal(idem_claim_begin(&c, &res, f->store, &r), 0);
	idem_result_clear(&res);
	test_clock_advance(&f->clock, 800);
	assert_int_equal(idem_claim_extend(c, 1000), 0);
	test_clock_advance(&f->clock, 800);
	assert_int_equal(idem_claim_begin(&c2, &res, f->store, &r), 0);
	assert_int_equal(res.outcome, IDEM_IN_PROGRESS);
	idem_result_clear(&res);
	assert_int_equal(idem_claim_complete(c, 200, "x", 1), 0);
	/* Completed: extend and abort no longer own anything. */
	assert_int_equal(idem_claim_extend(c, 1000), IDEM_ELEASE);
	assert_int_equal(idem_claim_abort(c), IDEM_ELEASE);
	idem_claim_free(c);
}

static void abort_releases(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "c", .len = 1, .persist = 1};
	idem_result res = {0};
	idem_claim *c = NULL;
	idem_record_info info;
	idem_request r;
	char fp[65];

	test_fp(fp, "{}");
	r = req_for(f->scope, "payment", "K", fp);
	assert_int_equal(idem_claim_begin(&c, &res, f->store, &r), 0);
	idem_result_clear(&res);
	assert_int_equal(idem_claim_abort(c), 0);
	idem_claim_free(c);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "K", 1),
	                 IDEM_ENOTFOUND);
	assert_int_equal(exec_unit(f, "payment", "K", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
}

/* Two-phase finish: business rows and completion land together, or not at all. */
static void finish_with_work(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "fin", .len = 3, .persist = 1};
	idem_result res = {0};
	idem_claim *c = NULL, *c2 = NULL;
	idem_record_info info;
	idem_request r;
	char fp[65];

	test_fp(fp, "{}");
	u.scope = f->scope;
	r = req_for(f->scope, "payment", "F1", fp);
	assert_int_equal(idem_claim_begin(&c, &res, f->store, &r), 0);
	u.key = "F1";
	assert_int_equal(idem_claim_finish(&res, c, unit_fn, &u), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_int_equal(res.stored, 1);
	idem_result_clear(&res);
	idem_claim_free(c);
	assert_int_equal(test_work_count(f->store, f->scope, "F1"), 1);
	assert_int_equal(exec_unit(f, "payment", "F1", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	assert_memory_equal(res.body, "fin", 3);
	idem_result_clear(&res);

	/* Lease lost before finishing: the work's rows must not land. */
	r = req_for(f->scope, "payment", "F2", fp);
	r.lease_ms = 1000;
	assert_int_equal(idem_claim_begin(&c, &res, f->store, &r), 0);
	test_clock_advance(&f->clock, 1001);
	assert_int_equal(idem_claim_begin(&c2, &res, f->store, &r), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	u.key = "F2";
	assert_int_equal(idem_claim_finish(&res, c, unit_fn, &u), IDEM_ELEASE);
	assert_int_equal(test_work_count(f->store, f->scope, "F2"), 0);
	/* An answer not to be kept frees the key. */
	u.persist = 0;
	assert_int_equal(idem_claim_finish(&res, c2, unit_fn, &u), 0);
	assert_int_equal(res.stored, 0);
	idem_result_clear(&res);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "F2", 2),
	                 IDEM_ENOTFOUND);
	assert_int_equal(test_work_count(f->store, f->scope, "F2"), 0);
	idem_claim_free(c);
	idem_claim_free(c2);
}

/* Past expires_at the key is free again, whatever the fingerprint. */
static void reuse_after_expiry(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "d", .len = 1, .persist = 1};
	idem_result res = {0};
	idem_request r;
	char fp1[65], fp2[65];

	test_fp(fp1, "{\"a\":1}");
	test_fp(fp2, "{\"a\":2}");
	r = req_for(f->scope, "payment", "K", fp1);
	r.ttl_ms = 60000;
	u.scope = f->scope;
	u.key = "K";
	assert_int_equal(idem_execute(&res, f->store, &r, unit_fn, &u), 0);
	idem_result_clear(&res);
	test_clock_advance(&f->clock, 59999);
	r.fingerprint = fp2;
	assert_int_equal(idem_execute(&res, f->store, &r, unit_fn, &u), 0);
	assert_int_equal(res.outcome, IDEM_MISMATCH);
	idem_result_clear(&res);
	test_clock_advance(&f->clock, 1);
	assert_int_equal(idem_execute(&res, f->store, &r, unit_fn, &u), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(idem_execute(&res, f->store, &r, unit_fn, &u), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	idem_result_clear(&res);
	assert_int_equal(u.calls, 2);
}

/* (scope, type, key) is the identity; keys compare byte for byte. */
static void composite_scope(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "e", .len = 1, .persist = 1};
	idem_result res = {0};
	char other[40], fp[65];
	idem_request r;

	test_scope(other);
	test_fp(fp, "{}");
	const char *keys[] = {"A1", "a1", "A1 ", "A1\t"};
	for (int i = 0; i < 2; i++) {
		assert_int_equal(exec_unit(f, "payment", keys[i], fp, &u, &res), 0);
		assert_int_equal(res.outcome, IDEM_FIRST);
		idem_result_clear(&res);
	}
	/* Trailing white space is not a different key: it is not a key at all. */
	for (int i = 2; i < 4; i++)
		assert_int_equal(exec_unit(f, "payment", keys[i], fp, &u, &res), IDEM_EINVAL);
	assert_int_equal(exec_unit(f, "refund", "A1", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	r = req_for(other, "payment", "A1", fp);
	u.scope = other;
	assert_int_equal(idem_execute(&res, f->store, &r, unit_fn, &u), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(u.calls, 4);
	/* SQL metacharacters are just bytes of the key. */
	assert_int_equal(
	    exec_unit(f, "payment", "x';DELETE/**/FROM/**/idem_records;--", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(exec_unit(f, "payment", "A1", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	idem_result_clear(&res);
}

static void bad_requests(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "f", .len = 1, .persist = 1};
	idem_result res = {0};
	char fp[65], key[300];

	test_fp(fp, "{}");
	memset(key, 'k', sizeof(key));
	key[255] = '\0';
	assert_int_equal(exec_unit(f, "payment", key, fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	key[255] = 'k';
	key[256] = '\0';
	assert_int_equal(exec_unit(f, "payment", key, fp, &u, &res), IDEM_EINVAL);
	assert_int_equal(exec_unit(f, "payment", "", fp, &u, &res), IDEM_EINVAL);
	assert_int_equal(exec_unit(f, "payment", "a\x01", fp, &u, &res), IDEM_EINVAL);
	assert_int_equal(exec_unit(f, "Payment", "k", fp, &u, &res), IDEM_EINVAL);
	assert_int_equal(exec_unit(f, "pay ment", "k", fp, &u, &res), IDEM_EINVAL);
	assert_int_equal(exec_unit(f, "payment", "k", "abc", &u, &res), IDEM_EINVAL);
	fp[0] = 'G';
	assert_int_equal(exec_unit(f, "payment", "k", fp, &u, &res), IDEM_EINVAL);
	assert_int_equal(u.calls, 1);
}

/* A unit that breaks NOT NULL or CHECK is an error; nothing of it remains. */
static void constraint_violations_are_errors(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "g", .len = 1, .persist = 1};
	idem_result res = {0};
	idem_record_info info;
	char fp[65];

	test_fp(fp, "{}");
	u.bad_sql = "INSERT INTO work_log (scope, k, worker) VALUES (NULL, 'x', 1)";
	assert_int_equal(exec_unit(f, "payment", "K", fp, &u, &res), IDEM_ECONSTRAINT);
	assert_int_equal(res.outcome, 0);
	assert_int_equal(idem_error_last()->code, IDEM_ECONSTRAINT);
	u.bad_sql = "INSERT INTO work_log (scope, k, worker) VALUES ('s', 'x', -1)";
	assert_int_equal(exec_unit(f, "payment", "K", fp, &u, &res), IDEM_ECONSTRAINT);
	u.bad_sql = "INSERT INTO no_such_table VALUES (1)";
	assert_int_equal(exec_unit(f, "payment", "K", fp, &u, &res), IDEM_ESTORE);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "K", 1),
	                 IDEM_ENOTFOUND);
	/* The key was never taken: a good retry runs. */
	u.bad_sql = NULL;
	assert_int_equal(exec_unit(f, "payment", "K", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(test_work_count(f->store, f->scope, "K"), 1);
	assert_true(idem_metrics_store_errors(f->store, IDEM_ECLASS_CONSTRAINT) >= 2);
}

static int create_uniq(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_exec(txn,
	                     "CREATE TABLE IF NOT EXISTS biz_orders (merchant VARCHAR(64) NOT NULL,"
	                     " order_no VARCHAR(64) NOT NULL, UNIQUE (merchant, order_no))",
	                     NULL, 0, NULL);
}

/* A business unique index is its own kind of error: the backstop. */
static void business_unique_conflict(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "h", .len = 1, .persist = 1};
	idem_result res = {0};
	char fp[65];

	assert_int_equal(idem_store_transact(f->store, create_uniq, NULL), 0);
	test_fp(fp, "{}");
	u.bad_sql = "INSERT INTO biz_orders (merchant, order_no) VALUES ('m', 'ORD-1')";
	assert_int_equal(exec_unit(f, "payment", "K1", fp, &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(exec_unit(f, "payment", "K2", fp, &u, &res), IDEM_ECONFLICT);
	assert_int_equal(exec_unit(f, "payment", "K2", fp, &u, &res), IDEM_ECONFLICT);
}

/* try_exec: a unit handles a conflict and goes on in the same transaction. */
static int try_then_continue(idem_txn *txn, void *ctx, idem_response *resp)
{
	const char *scope = ctx;
	idem_value p[2] = {IDEM_V_TEXT(scope), IDEM_V_TEXT("after")};
	int rc = idem_txn_try_exec(
	    txn, "INSERT INTO biz_orders (merchant, order_no) VALUES ('m', 'ORD-1')", NULL, 0,
	    NULL);

	if (rc != IDEM_ECONFLICT)
		return rc < 0 ? rc : IDEM_EINVAL;
	if ((rc = idem_txn_exec(txn, "INSERT INTO work_log (scope, k, worker) VALUES (?, ?, 1)", p,
	                        2, NULL)) < 0)
		return rc;
	return idem_response_set(resp, 200, "went on", 7);
}

static void try_exec_keeps_the_transaction(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "h", .len = 1, .persist = 1};
	idem_request r;
	idem_result res = {0};
	char fp[65];

	assert_int_equal(idem_store_transact(f->store, create_uniq, NULL), 0);
	test_fp(fp, "{}");
	u.bad_sql = "INSERT INTO biz_orders (merchant, order_no) VALUES ('m', 'ORD-1')";
	assert_int_equal(exec_unit(f, "payment", "K1", fp, &u, &res), 0);
	idem_result_clear(&res);
	r = req_for(f->scope, "payment", "K2", fp);
	assert_int_equal(idem_execute(&res, f->store, &r, try_then_continue, f->scope), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_int_equal(res.stored, 1);
	assert_memory_equal(res.body, "went on", 7);
	idem_result_clear(&res);
	assert_int_equal(test_work_count(f->store, f->scope, "after"), 1);
}

static int count_all(void *ctx, const idem_value *cols, int n)
{
	(void)cols;
	(void)n;
	(*(int *)ctx)++;
	return 0;
}

/* Purge: only expired rows, in batches; a live lease survives its expiry. */
static void purge(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "p", .len = 1, .persist = 1};
	idem_result res = {0};
	idem_claim *live = NULL, *dead = NULL;
	idem_request r;
	idem_record_info info;
	char fp[65], key[16];
	int64_t deleted = 0;
	int rows = 0;

	test_fp(fp, "{}");
	u.scope = f->scope;
	for (int i = 0; i < 5; i++) {
		snprintf(key, sizeof(key), "old%d", i);
		r = req_for(f->scope, "payment", key, fp);
		r.ttl_ms = 1000;
		u.key = key;
		assert_int_equal(idem_execute(&res, f->store, &r, unit_fn, &u), 0);
		idem_result_clear(&res);
	}
	for (int i = 0; i < 3; i++) {
		snprintf(key, sizeof(key), "new%d", i);
		r = req_for(f->scope, "payment", key, fp);
		r.ttl_ms = 100000;
		u.key = key;
		assert_int_equal(idem_execute(&res, f->store, &r, unit_fn, &u), 0);
		idem_result_clear(&res);
	}
	r = req_for(f->scope, "payment", "live", fp);
	r.ttl_ms = 1000;
	r.lease_ms = 100000;
	assert_int_equal(idem_claim_begin(&live, &res, f->store, &r), 0);
	idem_result_clear(&res);
	r = req_for(f->scope, "payment", "dead", fp);
	r.ttl_ms = 1000;
	r.lease_ms = 2000;
	assert_int_equal(idem_claim_begin(&dead, &res, f->store, &r), 0);
	idem_result_clear(&res);

	test_clock_advance(&f->clock, 5000);
	assert_int_equal(idem_store_purge(f->store, 2, 0, &deleted), 0);
	assert_int_equal(deleted, 6); /* 5 old + the PROCESSING one whose lease ran out */
	assert_int_equal(idem_metrics_purged(f->store), 6);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "live", 4), 0);
	assert_string_equal(info.status, "PROCESSING");
	idem_record_info_clear(&info);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "old0", 4),
	                 IDEM_ENOTFOUND);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "new2", 4), 0);
	idem_record_info_clear(&info);
	/* Business rows are never purged. */
	assert_int_equal(idem_store_query(f->store, "SELECT k FROM work_log WHERE scope = ?",
	                                  &IDEM_V_TEXT(f->scope), 1, count_all, &rows),
	                 0);
	assert_int_equal(rows, 8);
	/* max_batches bounds the work. */
	test_clock_advance(&f->clock, 1000000);
	assert_int_equal(idem_store_purge(f->store, 1, 2, &deleted), 0);
	assert_int_equal(deleted, 2);
	assert_int_equal(idem_store_purge(f->store, 0, 0, &deleted), IDEM_EINVAL);
	assert_int_equal(idem_claim_complete(dead, 201, "late", 4), IDEM_ELEASE);
	idem_claim_free(live);
	idem_claim_free(dead);
}

typedef struct {
	const char *type;
	uint64_t counts[IDEM_OUTCOME_COUNT + 1];
	int seen;
} count_probe;

static void probe(void *ctx, const char *type, const uint64_t counts[IDEM_OUTCOME_COUNT + 1])
{
	count_probe *p = ctx;

	if (strcmp(type, p->type) == 0) {
		memcpy(p->counts, counts, sizeof(p->counts));
		p->seen = 1;
	}
}

static void counters(void **state)
{
	fixture *f = *state;
	unit u = {.status = 201, .body = "i", .len = 1, .persist = 1};
	idem_result res = {0};
	count_probe p = {.type = "counted"};
	char fp[65], fp2[65];

	test_fp(fp, "{}");
	test_fp(fp2, "{\"x\":1}");
	for (int i = 0; i < 3; i++) {
		assert_int_equal(exec_unit(f, "counted", "K", fp, &u, &res), 0);
		idem_result_clear(&res);
	}
	assert_int_equal(exec_unit(f, "counted", "K", fp2, &u, &res), 0);
	idem_result_clear(&res);
	u.bad_sql = "INSERT INTO work_log (scope, k, worker) VALUES (NULL, 'x', 1)";
	assert_int_equal(exec_unit(f, "counted", "K2", fp, &u, &res), IDEM_ECONSTRAINT);
	idem_metrics_each(f->store, probe, &p);
	assert_true(p.seen);
	assert_int_equal(p.counts[IDEM_FIRST], 1);
	assert_int_equal(p.counts[IDEM_REPLAY], 2);
	assert_int_equal(p.counts[IDEM_MISMATCH], 1);
	assert_int_equal(p.counts[IDEM_IN_PROGRESS], 0);
	assert_int_equal(p.counts[IDEM_COUNT_ERROR], 1);
}

static void migrations_are_idempotent(void **state)
{
	fixture *f = *state;
	int v1 = -1, v2 = -1, cur = -1;

	assert_int_equal(idem_store_migrate(f->store, &v1), 0);
	assert_int_equal(idem_store_migrate(f->store, &v2), 0);
	assert_int_equal(v1, v2);
	assert_int_equal(v1, idem_store_schema_latest(f->store));
	assert_int_equal(idem_store_schema_version(f->store, &cur), 0);
	assert_int_equal(cur, v1);
	assert_int_equal(idem_store_ping(f->store), 0);
}

static void unknown_scheme(void **state)
{
	idem_store *s = (idem_store *)1;

	(void)state;
	assert_int_equal(idem_store_open(&s, "oracle://x", NULL), IDEM_EINVAL);
	assert_null(s);
	assert_non_null(strstr(idem_error_last()->message, "unknown store URL scheme"));
	assert_int_equal(idem_store_open(&s, "sqlite:", NULL), IDEM_EINVAL);
	idem_store_close(NULL);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
	    T(first_then_replay),
	    T(replay_through_write_path),
	    T(mismatch),
	    T(stored_business_error_replays),
	    T(unstored_answer_leaves_nothing),
	    T(in_progress_and_takeover),
	    T(mismatch_while_processing),
	    T(extend_keeps_the_lease),
	    T(abort_releases),
	    T(finish_with_work),
	    T(reuse_after_expiry),
	    T(composite_scope),
	    T(bad_requests),
	    T(constraint_violations_are_errors),
	    T(business_unique_conflict),
	    T(try_exec_keeps_the_transaction),
	    T(purge),
	    T(counters),
	    T(migrations_are_idempotent),
	    cmocka_unit_test(unknown_scheme),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
