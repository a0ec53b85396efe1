/* tests/support/support.c: see support.h. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/rand.h>

int64_t test_clock_read(void *ctx)
{
	return atomic_load(&((test_clock *)ctx)->now_ms);
}

void test_clock_advance(test_clock *c, int64_t ms)
{
	atomic_fetch_add(&c->now_ms, ms);
}

char *test_db_url(void)
{
	const char *env = getenv("IDEM_TEST_URL");
	char tmpl[] = "/tmp/idem-test-XXXXXX";
	char *url;

	if (env && *env)
		return strdup(env);
	assert_non_null(mkdtemp(tmpl));
	url = malloc(strlen(tmpl) + 32);
	assert_non_null(url);
	snprintf(url, strlen(tmpl) + 32, "sqlite:%s/t.db", tmpl);
	return url;
}

void test_db_drop(const char *url)
{
	char path[512], dir[512];
	const char *suffix[] = {"", "-wal", "-shm", "-journal"};

	if (strncmp(url, "sqlite:", 7) != 0 || strcmp(url, "sqlite::memory:") == 0)
		return;
	for (size_t i = 0; i < 4; i++) {
		snprintf(path, sizeof(path), "%s%s", url + 7, suffix[i]);
		unlink(path);
	}
	snprintf(dir, sizeof(dir), "%s", url + 7);
	char *slash = strrchr(dir, '/');
	if (slash) {
		*slash = '\0';
		rmdir(dir);
	}
}

idem_store *test_store_open(const char *url, test_clock *clock)
{
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *store = NULL;
	int rc;

	if (clock) {
		if (atomic_load(&clock->now_ms) == 0)
			atomic_store(&clock->now_ms, 1800000000000LL);
		opts.clock = test_clock_read;
		opts.clock_ctx = clock;
	}
	rc = idem_store_open(&store, url, &opts);
	if (rc != 0)
		fail_msg("idem_store_open(%s): %d %s", url, rc, idem_error_last()->message);
	return store;
}

void test_scope(char out[40])
{
	unsigned char r[8];

	assert_int_equal(RAND_bytes(r, sizeof(r)), 1);
	snprintf(out, 40, "t_%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5],
		 r[6], r[7]);
}

static int create_work_log(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_exec(txn,
			     "CREATE TABLE IF NOT EXISTS work_log ("
			     " scope VARCHAR(64) NOT NULL, k VARCHAR(255) NOT NULL,"
			     " worker INTEGER NOT NULL CHECK (worker >= 0))",
			     NULL, 0, NULL);
}

void test_create_work_log(idem_store *store)
{
	int rc = idem_store_transact(store, create_work_log, NULL);

	if (rc != 0)
		fail_msg("create work_log: %d %s", rc, idem_error_last()->message);
}

static int first_int(void *ctx, const idem_value *cols, int n)
{
	*(int64_t *)ctx = n > 0 ? cols[0].i : -1;
	return 1;
}

int64_t test_work_count(idem_store *store, const char *scope, const char *key)
{
	idem_value p[2] = {IDEM_V_TEXT(scope), IDEM_V_TEXT(key)};
	int64_t n = -1;
	int rc = idem_store_query(store, "SELECT count(*) FROM work_log WHERE scope = ? AND k = ?",
				  p, 2, first_int, &n);

	assert_int_equal(rc, 0);
	return n;
}

void test_fp(char out[65], const char *json)
{
	assert_int_equal(idem_fingerprint(out, "POST", "/v1/test", json, strlen(json)), 0);
}
