/*
 * tests/core/test_engine.c: the engine's side of the backend contract: an
 * ops table of another version is refused before any of it is called, and
 * the capability bits (not the backend's name) decide how many group-commit
 * writers run; a unit losing fast conflicts is retried past max_retries
 * while its time lasts, one whose attempts each wait stops at the budget.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/claim_internal.h"
#include "support.h"

static int opened;

static int counting_open(idem__backend **out, idem_store *store, const char *target,
                         const idem_store_opts *opts)
{
	opened++;
	return idem__sqlite_ops.open(out, store, target, opts);
}

static void other_ops_version_is_refused(void **state)
{
	idem__backend_ops ops = idem__sqlite_ops;
	idem_store *store = (idem_store *)&ops; /* must come back NULL */
	int rc;

	(void)state;
	ops.open = counting_open;
	opened = 0;
	for (int v = 0; v < 4; v++) {
		if (v == IDEM__BACKEND_OPS_VERSION)
			continue;
		ops.version = v;
		rc = idem__engine_open(&store, &ops,
		                       ":memory:", &(idem_store_opts)IDEM_STORE_OPTS_INIT);
		assert_int_equal(rc, IDEM_EINVAL);
		assert_null(store);
		assert_non_null(strstr(idem_error_last()->message, "ops version"));
	}
	assert_int_equal(opened, 0);
	ops.version = IDEM__BACKEND_OPS_VERSION;
	assert_int_equal(
	    idem__engine_open(&store, &ops, ":memory:", &(idem_store_opts)IDEM_STORE_OPTS_INIT), 0);
	assert_int_equal(opened, 1);
	idem_store_close(store);
}

/* A table of the right version but no table at all is refused too. */
static void null_ops_refused(void **state)
{
	idem_store *store = NULL;

	(void)state;
	assert_int_equal(
	    idem__engine_open(&store, NULL, "", &(idem_store_opts)IDEM_STORE_OPTS_INIT),
	    IDEM_EINVAL);
	assert_null(store);
}

static int noop(idem_txn *txn, void *ctx, idem_response *resp)
{
	(void)txn;
	(void)ctx;
	return idem_response_set(resp, 200, "ok", 2);
}

/*
 * SQLite announces IDEM__CAP_ONE_WRITER; the same driver without the bit
 * (under another name, to show the name plays no part) gets the writers
 * asked for. Both run units correctly.
 */
static void writers_follow_capabilities(void **state)
{
	idem__backend_ops ops = idem__sqlite_ops;
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	char *url = test_db_url();
	const char *path = url + strlen("sqlite:");

	(void)state;
	opts.batch_max = 8;
	opts.writers = 4;
	for (int pass = 0; pass < 2; pass++) {
		idem_store *store = NULL;
		idem_request r = IDEM_REQUEST_INIT;
		idem_result res = {0};
		char fp[65], key[8];
		int nwriters;

		if (pass == 1) {
			ops.caps &= ~IDEM__CAP_ONE_WRITER;
			ops.name = "sqlite-without-caps";
		}
		assert_int_equal(idem__engine_open(&store, &ops, path, &opts), 0);
		nwriters = idem__batch_writers(store->batch);
		assert_int_equal(nwriters, pass == 0 ? 1 : 4);
		test_fp(fp, "{}");
		snprintf(key, sizeof(key), "k%d", pass);
		r.scope = "m_1";
		r.business_type = "payment";
		r.key = key;
		r.key_len = strlen(key);
		r.fingerprint = fp;
		assert_int_equal(idem_execute(&res, store, &r, noop, NULL), 0);
		assert_int_equal(res.outcome, IDEM_FIRST);
		idem_result_clear(&res);
		idem_store_close(store);
	}
	test_db_drop(url);
	free(url);
}

/* ---- scopes in flight are bound to a writer ---- */

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int started, open, answered;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};

static int gated(idem_txn *txn, void *ctx, idem_response *resp)
{
	pthread_mutex_lock(&gate.lock);
	gate.started = 1;
	pthread_cond_broadcast(&gate.cond);
	while (!gate.open)
		pthread_cond_wait(&gate.cond, &gate.lock);
	pthread_mutex_unlock(&gate.lock);
	return noop(txn, ctx, resp);
}

static void counted(void *ctx, int rc, idem_result *res)
{
	assert_int_equal(rc, 0);
	assert_int_equal(res->outcome, IDEM_FIRST);
	idem_result_clear(res);
	(void)ctx;
	pthread_mutex_lock(&gate.lock);
	gate.answered++;
	pthread_cond_broadcast(&gate.cond);
	pthread_mutex_unlock(&gate.lock);
}

static unsigned fnv(const char *s)
{
	unsigned h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

/*
 * Two merchants whose hashes pick the same one of two writers still get
 * one writer each while both have units in flight; a merchant's second
 * unit goes where its first is; once answered, a scope is bound no more.
 */
static void scopes_in_flight_spread_over_writers(void **state)
{
	idem__backend_ops ops = idem__sqlite_ops;
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	char *url = test_db_url();
	idem_store *store = NULL;
	char a[16] = "m_a0", b[16], fp[65];
	const char *scopes[3] = {a, NULL, a}, *keys[3] = {"k1", "k2", "k3"};
	int wa, wb;

	(void)state;
	for (int i = 1; (snprintf(b, sizeof(b), "m_b%d", i), fnv(a) % 2 != fnv(b) % 2); i++)
		;
	scopes[1] = b;
	ops.caps &= ~IDEM__CAP_ONE_WRITER;
	opts.batch_max = 8;
	opts.writers = 2;
	assert_int_equal(idem__engine_open(&store, &ops, url + strlen("sqlite:"), &opts), 0);
	assert_int_equal(idem__batch_writers(store->batch), 2);
	test_fp(fp, "{}");
	for (int i = 0; i < 3; i++) {
		idem_request r = IDEM_REQUEST_INIT;

		r.scope = scopes[i];
		r.business_type = "payment";
		r.key = keys[i];
		r.key_len = 2;
		r.fingerprint = fp;
		idem_execute_async(store, &r, i == 0 ? gated : noop, NULL, counted, NULL);
		if (i == 0) { /* a's first unit holds its writer */
			pthread_mutex_lock(&gate.lock);
			while (!gate.started)
				pthread_cond_wait(&gate.cond, &gate.lock);
			pthread_mutex_unlock(&gate.lock);
		}
	}
	wa = idem__batch_writer_of(store->batch, a);
	wb = idem__batch_writer_of(store->batch, b);
	assert_true(wa >= 0 && wb >= 0);
	assert_int_not_equal(wa, wb);
	pthread_mutex_lock(&gate.lock);
	gate.open = 1;
	pthread_cond_broadcast(&gate.cond);
	while (gate.answered < 3)
		pthread_cond_wait(&gate.cond, &gate.lock);
	pthread_mutex_unlock(&gate.lock);
	assert_int_equal(idem__batch_writer_of(store->batch, a), -1);
	assert_int_equal(idem__batch_writer_of(store->batch, b), -1);
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

static int nothing(idem_txn *txn, void *ctx)
{
	(void)txn;
	(void)ctx;
	return 0;
}

/* A caller's mistake at the API boundary is IDEM_EINVAL, never a crash. */
static void bad_arguments_are_einval(void **state)
{
	idem_store *store = NULL;
	int v = 0;

	(void)state;
	assert_int_equal(idem_store_open(&store, "sqlite::memory:", NULL), 0);
	assert_int_equal(idem_store_ping(NULL), IDEM_EINVAL);
	assert_non_null(strstr(idem_error_last()->message, "invalid argument"));
	assert_int_equal(idem_store_migrate(NULL, &v), IDEM_EINVAL);
	assert_int_equal(idem_store_schema_version(store, NULL), IDEM_EINVAL);
	assert_int_equal(idem_store_purge(NULL, 10, 1, NULL), IDEM_EINVAL);
	assert_int_equal(idem_store_query(store, NULL, NULL, 0, NULL, NULL), IDEM_EINVAL);
	assert_int_equal(idem_store_query(store, "SELECT 1", NULL, 2, NULL, NULL), IDEM_EINVAL);
	assert_int_equal(idem_store_transact(store, NULL, NULL), IDEM_EINVAL);
	assert_int_equal(idem_txn_exec(NULL, "SELECT 1", NULL, 0, NULL), IDEM_EINVAL);
	assert_int_equal(idem_store_transact(store, nothing, NULL), 0);
	assert_int_equal(idem_store_ping(store), 0);
	idem_store_close(store);
}

/* Loses its first `lose` attempts with IDEM_ERETRY, each after `wait_ms`. */
struct loser {
	int lose, wait_ms, calls;
};

static int losing(idem_txn *txn, void *ctx)
{
	struct loser *l = ctx;

	(void)txn;
	if (l->wait_ms > 0)
		nanosleep(&(struct timespec){.tv_nsec = (long)l->wait_ms * 1000000L}, NULL);
	return l->calls++ < l->lose ? IDEM_ERETRY : 0;
}

/* Fast conflicts (a Galera certification failure, a deadlock) converge even
 * when a hot row makes a unit lose more often than max_retries; conflicts
 * that never end stop at a bounded count; slow attempts (a busy timeout each)
 * stop at the budget. */
static void fast_conflicts_retry_past_the_budget(void **state)
{
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *store = NULL;
	struct loser fast = {.lose = 10}, forever = {.lose = 1000},
	             slow = {.lose = 1000, .wait_ms = 400}, loaded = {.lose = 12, .wait_ms = 100};

	(void)state;
	opts.max_retries = 3;
	assert_int_equal(idem_store_open(&store, "sqlite::memory:", &opts), 0);
	assert_int_equal(idem_store_transact(store, losing, &fast), 0);
	assert_int_equal(fast.calls, 11);
	assert_int_equal(idem_store_transact(store, losing, &forever), IDEM_ERETRY);
	assert_true(forever.calls > 4 && forever.calls <= 33);
	/* Attempts of 400 ms each wait: they stop at the budget (1 + 3). */
	assert_int_equal(idem_store_transact(store, losing, &slow), IDEM_ERETRY);
	assert_int_equal(slow.calls, 4);
	/* Fast losses that each take 100 ms (a loaded machine) still converge,
	 * past 1 s in all: 12 losses, then the win. */
	assert_int_equal(idem_store_transact(store, losing, &loaded), 0);
	assert_int_equal(loaded.calls, 13);
	idem_store_close(store);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(other_ops_version_is_refused),
	    cmocka_unit_test(null_ops_refused),
	    cmocka_unit_test(writers_follow_capabilities),
	    cmocka_unit_test(scopes_in_flight_spread_over_writers),
	    cmocka_unit_test(bad_arguments_are_einval),
	    cmocka_unit_test(fast_conflicts_retry_past_the_budget),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
