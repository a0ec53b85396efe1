/*
 * tests/fault/test_deadline.c: one deadline per request, from its arrival
 * (idem_deadline_begin, which idemd calls when a request's head is in), for
 * every store call the request makes: the reads before its write (the API
 * key, the payment a notification credits) no longer hand the write a fresh
 * bound of its own (issue 13: answers up to 6.8 s past the deadline after a
 * black hole). And a deadline a request left behind never fails the next
 * request's calls, nor a ping.
 *
 * Nothing here measures time: a request is made to outlive its deadline by
 * sleeping past it before the write, and must then be answered unavailable
 * with nothing written; the checks that a call succeeds run well inside a
 * generous deadline. Runs on SQLite by default (group commit, whose units
 * carry the deadline), on PostgreSQL / MariaDB with IDEM_TEST_URL=postgres |
 * mariadb (there the reads themselves are bounded too).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support.h"

/* Long enough that a call made at once never misses it on a loaded machine. */
#define DEADLINE_MS 2000

typedef struct {
	char *url;
	idem_store *store;
	idem_pay *pay;
	char merchant[IDEM_PAY_ID_SIZE];
	char key[IDEM_PAY_SECRET_SIZE];
	char secret[IDEM_PAY_SECRET_SIZE];
} fixture;

static void sleep_past_deadline(void)
{
	struct timespec ts = {DEADLINE_MS / 1000 + 1, 0};

	while (nanosleep(&ts, &ts) != 0)
		;
}

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	int rc;

	if (!f)
		return -1;
	f->url = test_db_url();
	opts.request_timeout_ms = DEADLINE_MS;
	opts.batch_max = 8; /* group commit: the unit carries the request's deadline */
	opts.writers = 1;
	if ((rc = idem_store_open(&f->store, f->url, &opts)) != 0 ||
	    (rc = idem_pay_open(&f->pay, f->store, NULL)) != 0 ||
	    (rc = idem_pay_merchant_add(f->pay, "deadline", f->merchant, f->key)) != 0 ||
	    (rc = idem_pay_channel_add(f->pay, "wx", f->secret)) != 0) {
		fprintf(stderr, "setup: %d %s\n", rc, idem_error_last()->message);
		return -1;
	}
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fixture *f = *state;

	idem_deadline_end();
	idem_pay_close(f->pay);
	idem_store_close(f->store);
	test_db_drop(f->url);
	free(f->url);
	free(f);
	return 0;
}

static int write_as(idem_result *r, int (*fn)(idem_result *, idem_pay *, const idem_pay_request *),
                    fixture *f, const char *caller, const char *key, const char *path,
                    const char *body)
{
	idem_pay_request rq = {caller, key,  key ? strlen(key) : 0, 0, "POST",
	                       path,   body, strlen(body)};

	memset(r, 0, sizeof(*r));
	return fn(r, f->pay, &rq);
}

static void payment_body(char *out, size_t n, const char *order)
{
	snprintf(out, n,
	         "{\"merchant_order_no\":\"%s\",\"amount\":500,\"currency\":\"CNY\","
	         "\"channel\":\"wx\"}",
	         order);
}

static int payment_exists(fixture *f, const char *order)
{
	idem_result r = {0};
	int rc, status;

	idem_deadline_begin(f->store);
	rc = idem_pay_find_payment(&r, f->pay, f->merchant, order);
	idem_deadline_end();
	assert_int_equal(rc, 0);
	status = r.http_status;
	idem_result_clear(&r);
	assert_true(status == 200 || status == 404);
	return status == 200;
}

/*
 * The request arrived, authenticated, and its deadline passed before its
 * write was made: the write is answered unavailable and never runs. Before
 * the fix the write took a fresh 10 s of its own and was acknowledged late.
 */
static void test_write_after_deadline_unrun(void **state)
{
	fixture *f = *state;
	char who[IDEM_PAY_ID_SIZE], body[256];
	idem_result r;
	int rc;

	idem_deadline_begin(f->store);
	assert_int_equal(idem_pay_authenticate(f->pay, f->key, strlen(f->key), who), 0);
	sleep_past_deadline();
	payment_body(body, sizeof(body), "late-1");
	rc =
	    write_as(&r, idem_pay_create_payment, f, f->merchant, "k-late-1", "/v1/payments", body);
	idem_deadline_end();
	assert_int_equal(rc, IDEM_EUNAVAIL);
	idem_result_clear(&r);
	assert_false(payment_exists(f, "late-1"));

	/* The retry, a request of its own with a deadline of its own, runs once. */
	idem_deadline_begin(f->store);
	rc =
	    write_as(&r, idem_pay_create_payment, f, f->merchant, "k-late-1", "/v1/payments", body);
	idem_deadline_end();
	assert_int_equal(rc, 0);
	assert_int_equal(r.http_status, 201);
	assert_int_equal(r.outcome, IDEM_FIRST);
	idem_result_clear(&r);
	assert_true(payment_exists(f, "late-1"));
}

/* The payment a notification credits is read first: that read's time counts. */
static void test_notification_after_deadline_unrun(void **state)
{
	fixture *f = *state;
	char body[320], id[64];
	idem_result r;
	json_t *doc;
	int rc;

	payment_body(body, sizeof(body), "late-2");
	idem_deadline_begin(f->store);
	rc =
	    write_as(&r, idem_pay_create_payment, f, f->merchant, "k-late-2", "/v1/payments", body);
	idem_deadline_end();
	assert_int_equal(rc, 0);
	assert_int_equal(r.http_status, 201);
	doc = json_loadb((const char *)r.body, r.body_len, 0, NULL);
	assert_non_null(doc);
	snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(doc, "id")));
	json_decref(doc);
	idem_result_clear(&r);

	snprintf(body, sizeof(body),
	         "{\"notify_id\":\"n-late-2\",\"payment_id\":\"%s\",\"channel_txn_id\":\"T-2\","
	         "\"status\":\"SUCCESS\",\"amount\":500}",
	         id);
	idem_deadline_begin(f->store);
	sleep_past_deadline();
	rc = write_as(&r, idem_pay_notify, f, "wx", NULL, "/v1/notifications/wx", body);
	idem_deadline_end();
	assert_int_equal(rc, IDEM_EUNAVAIL);
	idem_result_clear(&r);

	/* Nothing was credited: the retry is the first execution. */
	idem_deadline_begin(f->store);
	rc = write_as(&r, idem_pay_notify, f, "wx", NULL, "/v1/notifications/wx", body);
	idem_deadline_end();
	assert_int_equal(rc, 0);
	assert_int_equal(r.http_status, 200);
	assert_int_equal(r.outcome, IDEM_FIRST);
	idem_result_clear(&r);
}

/*
 * A deadline a request left on the thread, past now: the next request's
 * begin replaces it, an end clears it, and a ping never sees it.
 */
static void test_stale_deadline_never_inherited(void **state)
{
	fixture *f = *state;
	char who[IDEM_PAY_ID_SIZE], body[256];
	idem_result r;
	int64_t v = 0;
	int rc;

	idem_deadline_begin(f->store);
	sleep_past_deadline(); /* ... and no idem_deadline_end: left behind */
	assert_true(idem_deadline_get() != 0);
	assert_int_equal(idem_store_ping(f->store), 0);

	/* The next request on this thread. */
	idem_deadline_begin(f->store);
	assert_int_equal(idem_pay_authenticate(f->pay, f->key, strlen(f->key), who), 0);
	payment_body(body, sizeof(body), "late-3");
	rc =
	    write_as(&r, idem_pay_create_payment, f, f->merchant, "k-late-3", "/v1/payments", body);
	assert_int_equal(rc, 0);
	assert_int_equal(r.http_status, 201);
	idem_result_clear(&r);

	/* Ended, then past: nothing is left to bound the next call. */
	sleep_past_deadline();
	idem_deadline_end();
	assert_int_equal(idem_deadline_get(), 0);
	assert_int_equal(idem_store_ping(f->store), 0);
	v = 0;
	assert_int_equal(idem_store_query(f->store, "SELECT 1", NULL, 0, test_first_int, &v), 0);
	assert_int_equal(v, 1);

	/* Carried to another thread and back (the channel pool's way). */
	idem_deadline_begin(f->store);
	v = idem_deadline_get();
	idem_deadline_adopt(0);
	assert_int_equal(idem_deadline_get(), 0);
	idem_deadline_adopt(v);
	assert_int_equal(idem_deadline_get(), v);
	idem_deadline_end();

	/* A store without request_timeout_ms leaves the thread without one. */
	idem_deadline_begin(NULL);
	assert_int_equal(idem_deadline_get(), 0);
}

/* ---- a unit queued behind a writer that hangs ---------------------------- */

typedef struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int entered, release, done, rc;
} gate;

static gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
static gate g2 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};

/* The store hangs inside this unit (as on a black hole) until released. */
static int hang_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	(void)txn;
	(void)ctx;
	pthread_mutex_lock(&g.lock);
	g.entered = 1;
	pthread_cond_broadcast(&g.cond);
	while (!g.release)
		pthread_cond_wait(&g.cond, &g.lock);
	pthread_mutex_unlock(&g.lock);
	return idem_response_set(resp, 201, "hung", 4);
}

static int count_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	(void)txn;
	(*(int *)ctx)++;
	return idem_response_set(resp, 201, "ran", 3);
}

static void gate_done(void *ctx, int rc, idem_result *res)
{
	gate *x = ctx;

	/* res is the callee's (claim.h): the units that ran hand their body here. */
	idem_result_clear(res);
	pthread_mutex_lock(&x->lock);
	x->rc = rc;
	x->done = 1;
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
}

/* Wait for flag, at most s seconds (a bound against hanging, not a timing). */
static int gate_wait(gate *x, int *flag, int s)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += s;
	pthread_mutex_lock(&x->lock);
	while (!*flag && pthread_cond_timedwait(&x->cond, &x->lock, &until) == 0)
		;
	pthread_mutex_unlock(&x->lock);
	return *flag;
}

static void request_of(idem_request *r, const char *key, const char *fp)
{
	*r = (idem_request)IDEM_REQUEST_INIT;
	r->scope = "deadline-reaper";
	r->business_type = "payment";
	r->key = key;
	r->key_len = strlen(key);
	r->fingerprint = fp;
}

/*
 * The writer of a scope hangs in a batch; a request queued behind it is
 * answered unavailable when its own deadline passes, unrun, not when the
 * writer comes back (before: up to the hung batch's deadline late).
 */
static void test_queued_unit_answered_at_its_deadline(void **state)
{
	fixture *f = *state;
	idem_request r;
	char fp[65];
	int ran = 0, answered_while_hung;

	test_fp(fp, "{}");
	request_of(&r, "hang", fp);
	idem_execute_async(f->store, &r, hang_work, NULL, gate_done, &g);
	assert_true(gate_wait(&g, &g.entered, 60));

	idem_deadline_begin(f->store);
	request_of(&r, "queued", fp);
	idem_execute_async(f->store, &r, count_work, &ran, gate_done, &g2);
	idem_deadline_end();
	/* Its deadline is DEADLINE_MS away; the writer stays hung all along. */
	answered_while_hung = gate_wait(&g2, &g2.done, 4 * DEADLINE_MS / 1000);

	pthread_mutex_lock(&g.lock);
	g.release = 1;
	pthread_cond_broadcast(&g.cond);
	pthread_mutex_unlock(&g.lock);
	assert_true(gate_wait(&g, &g.done, 60));
	assert_true(gate_wait(&g2, &g2.done, 60));
	assert_true(answered_while_hung);
	assert_int_equal(g2.rc, IDEM_EUNAVAIL);
	assert_int_equal(ran, 0);

	/* Unrun: its retry is the first execution. */
	{
		idem_result res = {0};

		idem_deadline_begin(f->store);
		request_of(&r, "queued", fp);
		assert_int_equal(idem_execute(&res, f->store, &r, count_work, &ran), 0);
		idem_deadline_end();
		assert_int_equal(res.outcome, IDEM_FIRST);
		assert_int_equal(ran, 1);
		idem_result_clear(&res);
	}
}

/* ---- a batch that failed: its units rerun alone, earliest deadline first */

static gate g3 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
static gate g4 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
static gate g5 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0};
static int fail_calls;

/* In the batch: an error that ends the batch (all rerun alone); alone: hang. */
static int fail_then_hang(idem_txn *txn, void *ctx, idem_response *resp)
{
	(void)ctx;
	if (fail_calls++ == 0) {
		(void)idem_txn_exec(txn, "SELECT no_such_column FROM no_such_table", NULL, 0, NULL);
		return IDEM_ESTORE;
	}
	pthread_mutex_lock(&g4.lock);
	g4.entered = 1;
	pthread_cond_broadcast(&g4.cond);
	while (!g4.release)
		pthread_cond_wait(&g4.cond, &g4.lock);
	pthread_mutex_unlock(&g4.lock);
	return idem_response_set(resp, 201, "late", 4);
}

static void gate_reset(gate *x)
{
	pthread_mutex_lock(&x->lock);
	x->entered = x->release = x->done = x->rc = 0;
	pthread_mutex_unlock(&x->lock);
}

static void release(gate *x)
{
	pthread_mutex_lock(&x->lock);
	x->release = 1;
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
}

/*
 * A batch [A, B] fails on A's SQL, so both rerun alone. A's deadline is far
 * (it arrived last, with nothing to read), B's near: B must not wait for A,
 * which now hangs. Before: queue order, B answered only once A returned.
 */
static void test_alone_reruns_earliest_deadline_first(void **state)
{
	fixture *f = *state;
	idem_request r;
	char fp[65];
	int ran = 0, b_while_a_hung;
	int64_t now;

	gate_reset(&g);
	test_fp(fp, "{}");
	request_of(&r, "hold", fp); /* holds the writer while A and B queue */
	idem_execute_async(f->store, &r, hang_work, NULL, gate_done, &g);
	assert_true(gate_wait(&g, &g.entered, 60));

	idem_deadline_begin(f->store);
	now = idem_deadline_get();
	idem_deadline_adopt(now + 60LL * 1000000); /* A: a late arrival's deadline */
	request_of(&r, "a", fp);
	idem_execute_async(f->store, &r, fail_then_hang, NULL, gate_done, &g3);
	idem_deadline_adopt(now + 20LL * 1000000); /* B: nearer */
	request_of(&r, "b", fp);
	idem_execute_async(f->store, &r, count_work, &ran, gate_done, &g5);
	idem_deadline_end();
	release(&g); /* the writer takes A and B as one batch */
	assert_true(gate_wait(&g, &g.done, 60));

	b_while_a_hung = gate_wait(&g5, &g5.done, 15);
	release(&g4);
	assert_true(gate_wait(&g3, &g3.done, 60));
	assert_true(gate_wait(&g5, &g5.done, 60));
	assert_true(b_while_a_hung);
	assert_int_equal(g5.rc, 0);
	assert_int_equal(ran, 1);
	assert_int_equal(fail_calls, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_write_after_deadline_unrun, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_notification_after_deadline_unrun, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(test_stale_deadline_never_inherited, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_queued_unit_answered_at_its_deadline, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(test_alone_reruns_earliest_deadline_first, setup,
	                                    teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
