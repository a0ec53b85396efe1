/*
 * tests/core/test_batch.c: group commit. Units queued together run in one
 * transaction under their own savepoints: a failing unit rolls back alone,
 * a failing COMMIT acknowledges nobody, and closing the store drains the
 * queue with every answer delivered.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

#define UNITS 10

typedef struct {
	const char *scope;
	char key[16];
	const char *sql; /* run instead of the work_log insert */
	int done, rc;
	idem_result res;
	pthread_mutex_t *lock;
	pthread_cond_t *cond;
} job;

static int work(idem_txn *txn, void *ctx, idem_response *resp)
{
	job *j = ctx;
	idem_value p[2] = {IDEM_V_TEXT(j->scope), IDEM_V_TEXT(j->key)};
	int rc = idem_txn_exec(
	    txn, j->sql ? j->sql : "INSERT INTO work_log (scope, k, worker) VALUES (?, ?, 1)", p,
	    j->sql ? 0 : 2, NULL);

	if (rc < 0)
		return rc;
	return idem_response_set(resp, 201, j->key, strlen(j->key));
}

static void on_done(void *ctx, int rc, idem_result *res)
{
	job *j = ctx;

	pthread_mutex_lock(j->lock);
	j->rc = rc;
	j->res = *res;
	memset(res, 0, sizeof(*res));
	j->done = 1;
	pthread_cond_broadcast(j->cond);
	pthread_mutex_unlock(j->lock);
}

typedef struct {
	char *url;
	idem_store *store;
	char scope[40];
	char fp[65];
	job jobs[UNITS];
	pthread_mutex_t lock;
	pthread_cond_t cond;
} fixture;

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;

	f->url = test_db_url();
	opts.batch_max = 64;
	opts.batch_wait_us = 300000; /* long enough that all ten land in one batch */
	if (idem_store_open(&f->store, f->url, &opts) != 0)
		fail_msg("open: %s", idem_error_last()->message);
	test_create_work_log(f->store);
	test_scope(f->scope);
	test_fp(f->fp, "{}");
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fixture *f = *state;

	idem_store_close(f->store);
	for (int i = 0; i < UNITS; i++)
		idem_result_clear(&f->jobs[i].res);
	pthread_mutex_destroy(&f->lock);
	pthread_cond_destroy(&f->cond);
	test_db_drop(f->url);
	free(f->url);
	free(f);
	return 0;
}

/* j made ready for key in f's scope, and *r the request for it. */
static void prepare(fixture *f, job *j, const char *key, idem_request *r)
{
	*r = (idem_request)IDEM_REQUEST_INIT;
	idem_result_clear(&j->res);
	j->scope = f->scope;
	snprintf(j->key, sizeof(j->key), "%s", key);
	j->sql = NULL;
	j->done = 0;
	j->lock = &f->lock;
	j->cond = &f->cond;
	r->scope = f->scope;
	r->business_type = "payment";
	r->key = j->key;
	r->key_len = strlen(j->key);
	r->fingerprint = f->fp;
}

static void submit_all(fixture *f, int bad, const char *bad_sql)
{
	for (int i = 0; i < UNITS; i++) {
		job *j = &f->jobs[i];
		idem_request r;
		char key[16];

		snprintf(key, sizeof(key), "B%d", i);
		prepare(f, j, key, &r);
		j->sql = i == bad ? bad_sql : NULL;
		idem_execute_async(f->store, &r, work, j, on_done, j);
	}
}

static void wait_all(fixture *f)
{
	pthread_mutex_lock(&f->lock);
	for (int i = 0; i < UNITS; i++)
		while (!f->jobs[i].done)
			pthread_cond_wait(&f->cond, &f->lock);
	pthread_mutex_unlock(&f->lock);
}

static int record_exists(fixture *f, const char *key)
{
	idem_record_info info;
	int rc = idem_record_get(&info, f->store, f->scope, "payment", key, strlen(key));

	idem_record_info_clear(&info);
	return rc == 0;
}

static void failing_unit_rolls_back_alone(void **state)
{
	fixture *f = *state;

	submit_all(f, 5, "INSERT INTO work_log (scope, k, worker) VALUES (NULL, 'x', 1)");
	wait_all(f);
	for (int i = 0; i < UNITS; i++) {
		job *j = &f->jobs[i];

		if (i == 5) {
			assert_int_equal(j->rc, IDEM_ECONSTRAINT);
			assert_false(record_exists(f, j->key));
			continue;
		}
		assert_int_equal(j->rc, 0);
		assert_int_equal(j->res.outcome, IDEM_FIRST);
		assert_int_equal(j->res.stored, 1);
		assert_memory_equal(j->res.body, j->key, strlen(j->key));
		assert_int_equal(test_work_count(f->store, f->scope, j->key), 1);
		assert_true(record_exists(f, j->key));
	}
}

static int create_fk(idem_txn *txn, void *ctx)
{
	int rc;

	(void)ctx;
	if ((rc = idem_txn_exec(txn, "CREATE TABLE parent (id INTEGER PRIMARY KEY)", NULL, 0,
	                        NULL)) < 0)
		return rc;
	return idem_txn_exec(txn,
	                     "CREATE TABLE child (pid INTEGER REFERENCES parent (id)"
	                     " DEFERRABLE INITIALLY DEFERRED)",
	                     NULL, 0, NULL);
}

/*
 * A deferred foreign key lets every statement pass and makes the COMMIT
 * fail: the batch's one COMMIT fails, so nobody may be acknowledged.
 */
static void failed_commit_acknowledges_none(void **state)
{
	fixture *f = *state;

	assert_int_equal(idem_store_transact(f->store, create_fk, NULL), 0);
	submit_all(f, 3, "INSERT INTO child (pid) VALUES (999)");
	wait_all(f);
	for (int i = 0; i < UNITS; i++) {
		job *j = &f->jobs[i];

		if (j->rc == 0)
			fail_msg("unit %d acknowledged though the COMMIT failed", i);
		assert_int_equal(j->res.body, NULL);
		assert_false(record_exists(f, j->key));
		assert_int_equal(test_work_count(f->store, f->scope, j->key), 0);
	}
	/* Nothing was taken: the same keys run afresh. */
	submit_all(f, -1, NULL);
	wait_all(f);
	for (int i = 0; i < UNITS; i++) {
		assert_int_equal(f->jobs[i].rc, 0);
		assert_int_equal(f->jobs[i].res.outcome, IDEM_FIRST);
	}
}

/* Duplicates in one batch: one execution, the rest replay its body. */
static void duplicates_in_one_batch(void **state)
{
	fixture *f = *state;

	for (int i = 0; i < UNITS; i++) {
		job *j = &f->jobs[i];
		idem_request r;

		prepare(f, j, "SAME", &r);
		idem_execute_async(f->store, &r, work, j, on_done, j);
	}
	wait_all(f);
	assert_int_equal(f->jobs[0].res.outcome, IDEM_FIRST);
	for (int i = 1; i < UNITS; i++) {
		assert_int_equal(f->jobs[i].rc, 0);
		assert_int_equal(f->jobs[i].res.outcome, IDEM_REPLAY);
		assert_memory_equal(f->jobs[i].res.body, "SAME", 4);
	}
	assert_int_equal(test_work_count(f->store, f->scope, "SAME"), 1);
}

/* Closing the store delivers every queued unit's answer, committed. */
static void close_drains(void **state)
{
	fixture *f = *state;

	submit_all(f, -1, NULL);
	idem_store_close(f->store);
	f->store = test_store_open(f->url, NULL);
	for (int i = 0; i < UNITS; i++) {
		assert_true(f->jobs[i].done);
		assert_int_equal(f->jobs[i].rc, 0);
		assert_true(record_exists(f, f->jobs[i].key));
	}
}

static _Atomic int slow_started;

static int slow_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	struct timespec ts = {0, 400 * 1000000L};

	atomic_store(&slow_started, 1);
	nanosleep(&ts, NULL); /* the store is slow: the writer is held */
	return work(txn, ctx, resp);
}

static void submit(fixture *f, job *j, const char *key, idem_work_fn fn)
{
	idem_request r;

	prepare(f, j, key, &r);
	idem_execute_async(f->store, &r, fn, j, on_done, j);
}

/*
 * Units that waited in the queue longer than queue_timeout_ms behind a slow
 * batch are answered IDEM_EUNAVAIL without running, and a retry runs afresh.
 */
static void queue_timeout_sheds_stale_units(void **state)
{
	fixture *f = *state;
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	struct timespec tick = {0, 1000000L};

	idem_store_close(f->store);
	opts.batch_max = 64;
	opts.queue_timeout_ms = 100;
	assert_int_equal(idem_store_open(&f->store, f->url, &opts), 0);
	atomic_store(&slow_started, 0);
	submit(f, &f->jobs[0], "SLOW", slow_work);
	while (!atomic_load(&slow_started)) /* the writer has taken SLOW alone */
		nanosleep(&tick, NULL);
	submit(f, &f->jobs[1], "Q1", work);
	submit(f, &f->jobs[2], "Q2", work);
	pthread_mutex_lock(&f->lock);
	for (int i = 0; i < 3; i++)
		while (!f->jobs[i].done)
			pthread_cond_wait(&f->cond, &f->lock);
	pthread_mutex_unlock(&f->lock);
	assert_int_equal(f->jobs[0].rc, 0);
	assert_int_equal(f->jobs[0].res.outcome, IDEM_FIRST);
	for (int i = 1; i < 3; i++) {
		assert_int_equal(f->jobs[i].rc, IDEM_EUNAVAIL);
		assert_false(record_exists(f, f->jobs[i].key));
		assert_int_equal(test_work_count(f->store, f->scope, f->jobs[i].key), 0);
	}
	assert_true(idem_metrics_store_errors(f->store, IDEM_ECLASS_UNAVAILABLE) >= 2);
	/* Nothing was taken: the retry runs. */
	submit(f, &f->jobs[1], "Q1", work);
	pthread_mutex_lock(&f->lock);
	while (!f->jobs[1].done)
		pthread_cond_wait(&f->cond, &f->lock);
	pthread_mutex_unlock(&f->lock);
	assert_int_equal(f->jobs[1].rc, 0);
	assert_int_equal(f->jobs[1].res.outcome, IDEM_FIRST);
}

/* ---- idem_execute_async_nowait: no read before the write ---- */

static idem_store *open_nowait(fixture *f, int batch_max, size_t cache_bytes)
{
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *s = NULL;

	opts.batch_max = batch_max;
	opts.cache_bytes = cache_bytes;
	opts.cache_entries = cache_bytes ? 10000 : 0;
	if (idem_store_open(&s, f->url, &opts) != 0)
		fail_msg("open: %s", idem_error_last()->message);
	return s;
}

/* nowait on f->store: its return; j is prepared as submit() does. */
static int nowait(fixture *f, job *j, const char *key)
{
	idem_request r;

	prepare(f, j, key, &r);
	return idem_execute_async_nowait(f->store, &r, work, j, on_done, j);
}

static void wait_one(fixture *f, job *j)
{
	pthread_mutex_lock(&f->lock);
	while (!j->done)
		pthread_cond_wait(&f->cond, &f->lock);
	pthread_mutex_unlock(&f->lock);
}

/* Without group commit or without a front cache it never starts. */
static void nowait_needs_batch_and_cache(void **state)
{
	fixture *f = *state;
	job *j = &f->jobs[0];
	idem_request r = IDEM_REQUEST_INIT;

	idem_store_close(f->store);
	f->store = open_nowait(f, 1, 1 << 20);
	assert_int_equal(nowait(f, j, "N0"), IDEM_EWOULDBLOCK);
	idem_store_close(f->store);
	f->store = open_nowait(f, 64, 0);
	assert_int_equal(nowait(f, j, "N0"), IDEM_EWOULDBLOCK);
	assert_false(j->done);
	assert_false(record_exists(f, "N0"));
	/* What idem_execute_async answers (NULLs, an invalid request) is left to it. */
	assert_int_equal(idem_execute_async_nowait(NULL, &r, work, j, on_done, j),
	                 IDEM_EWOULDBLOCK);
	assert_int_equal(idem_execute_async_nowait(f->store, NULL, work, j, on_done, j),
	                 IDEM_EWOULDBLOCK);
	assert_int_equal(idem_execute_async_nowait(f->store, &r, work, j, on_done, j),
	                 IDEM_EWOULDBLOCK);
	assert_false(j->done);
}

/*
 * The unit goes to the writer unread, and its claim decides: FIRST once; a
 * cached duplicate is answered before the call returns; a duplicate the
 * cache does not hold (a new process: the store reopened) is answered by
 * the writer's claim, REPLAY with the first body, the work not run again.
 */
static void nowait_claim_decides(void **state)
{
	fixture *f = *state;
	job *j = &f->jobs[0];

	idem_store_close(f->store);
	f->store = open_nowait(f, 64, 1 << 20);
	assert_int_equal(nowait(f, j, "N1"), 0);
	wait_one(f, j);
	assert_int_equal(j->rc, 0);
	assert_int_equal(j->res.outcome, IDEM_FIRST);
	assert_int_equal(nowait(f, j, "N1"), 0);
	assert_true(j->done); /* from the front cache, on this thread */
	assert_int_equal(j->res.outcome, IDEM_REPLAY);
	idem_store_close(f->store);
	f->store = open_nowait(f, 64, 1 << 20);
	assert_int_equal(nowait(f, j, "N1"), 0);
	wait_one(f, j);
	assert_int_equal(j->rc, 0);
	assert_int_equal(j->res.outcome, IDEM_REPLAY);
	assert_memory_equal(j->res.body, "N1", 2);
	assert_int_equal(test_work_count(f->store, f->scope, "N1"), 1);
}

/*
 * When the cache's misses are often duplicates (here: every key again after
 * a restart), the read before the write pays and nowait hands the request
 * back; once misses are new keys again, nowait starts them again.
 */
static void nowait_yields_to_the_read_during_duplicates(void **state)
{
	fixture *f = *state;
	job *j = &f->jobs[0];
	char key[16];
	int i, refused = 0;

	idem_store_close(f->store);
	f->store = open_nowait(f, 64, 1 << 20);
	for (i = 0; i < 40; i++) {
		snprintf(key, sizeof(key), "D%d", i);
		submit(f, j, key, work);
		wait_one(f, j);
		assert_int_equal(j->res.outcome, IDEM_FIRST);
	}
	idem_store_close(f->store);
	f->store = open_nowait(f, 64, 1 << 20);
	for (i = 0; i < 40 && !refused; i++) {
		snprintf(key, sizeof(key), "D%d", i);
		if (nowait(f, j, key) == IDEM_EWOULDBLOCK) {
			refused = 1;
			break;
		}
		wait_one(f, j);
		assert_int_equal(j->res.outcome, IDEM_REPLAY);
	}
	assert_true(refused);
	assert_in_range(i, 5, 20); /* a storm of duplicates is noticed soon */
	assert_false(j->done);
	/* New keys through the read: each read that finds nothing counts. */
	for (i = 0; i < 300 && nowait(f, j, "NEW") == IDEM_EWOULDBLOCK; i++) {
		snprintf(key, sizeof(key), "F%d", i);
		submit(f, j, key, work);
		wait_one(f, j);
		assert_int_equal(j->res.outcome, IDEM_FIRST);
	}
	assert_in_range(i, 1, 299);
	wait_one(f, j);
	assert_int_equal(j->res.outcome, IDEM_FIRST);
	assert_memory_equal(j->res.body, "NEW", 3);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
	    T(failing_unit_rolls_back_alone),
	    T(failed_commit_acknowledges_none),
	    T(duplicates_in_one_batch),
	    T(close_drains),
	    T(queue_timeout_sheds_stale_units),
	    T(nowait_needs_batch_and_cache),
	    T(nowait_claim_decides),
	    T(nowait_yields_to_the_read_during_duplicates),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
