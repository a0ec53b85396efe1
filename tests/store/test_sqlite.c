/*
 * tests/store/test_sqlite.c: what is particular to the SQLite backend: the
 * durability settings, bad database files, the write lock held by another
 * process, and migrations racing from two processes.
 */
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.h"

static const char *path_of(const char *url)
{
	return url + strlen("sqlite:");
}

/* A payment request of merchant m_1 for key, fingerprinted over "{}". */
static void payment_request(idem_request *r, char fp[65], const char *key)
{
	test_fp(fp, "{}");
	r->scope = "m_1";
	r->business_type = "payment";
	r->key = key;
	r->key_len = strlen(key);
	r->fingerprint = fp;
}

static int first_text(void *ctx, const idem_value *cols, int n)
{
	snprintf(ctx, 32, "%.*s", n > 0 ? (int)cols[0].len : 0,
	         n > 0 ? (const char *)cols[0].p : "");
	return 1;
}

static void durable_by_default(void **state)
{
	char *url = test_db_url();
	idem_store *store = test_store_open(url, NULL);
	char mode[32] = "";
	int64_t sync = -1;

	(void)state;
	assert_string_equal(idem_store_backend(store), "sqlite");
	assert_int_equal(idem_store_query(store, "PRAGMA journal_mode", NULL, 0, first_text, mode),
	                 0);
	assert_string_equal(mode, "wal");
	assert_int_equal(
	    idem_store_query(store, "PRAGMA synchronous", NULL, 0, test_first_int, &sync), 0);
	assert_int_equal(sync, 2); /* FULL */
	idem_store_close(store);

	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	opts.synchronous_full = 0;
	assert_int_equal(idem_store_open(&store, url, &opts), 0);
	assert_int_equal(
	    idem_store_query(store, "PRAGMA synchronous", NULL, 0, test_first_int, &sync), 0);
	assert_int_equal(sync, 1); /* NORMAL, only when asked */
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

static void memory_store(void **state)
{
	idem_store *store = NULL;
	idem_request r = IDEM_REQUEST_INIT;
	idem_result res = {0};
	idem_claim *c = NULL;
	char fp[65];

	(void)state;
	assert_int_equal(idem_store_open(&store, "sqlite::memory:", NULL), 0);
	payment_request(&r, fp, "k");
	assert_int_equal(idem_claim_begin(&c, &res, store, &r), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_int_equal(idem_claim_complete(c, 201, "m", 1), 0);
	idem_claim_free(c);
	assert_int_equal(idem_claim_begin(&c, &res, store, &r), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	idem_result_clear(&res);
	idem_store_close(store);
}

static void not_a_database(void **state)
{
	char *url = test_db_url();
	idem_store *store = (idem_store *)1;
	int fd = open(path_of(url), O_CREAT | O_WRONLY | O_TRUNC, 0600);

	(void)state;
	assert_true(fd >= 0);
	for (int i = 0; i < 200; i++)
		assert_int_equal(write(fd, "this is not a database file. ", 29), 29);
	close(fd);
	assert_int_equal(idem_store_open(&store, url, NULL), IDEM_ECORRUPT);
	assert_null(store);
	assert_int_equal(idem_error_last()->driver_code, SQLITE_NOTADB);
	assert_non_null(strstr(idem_error_last()->message, "not a database"));
	test_db_drop(url);
	free(url);
}

static void unopenable_paths(void **state)
{
	char dir[] = "/tmp/idem-test-XXXXXX", url[256], file[200];
	idem_store *store = NULL;
	int fd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	/* The path is a directory. */
	snprintf(url, sizeof(url), "sqlite:%s", dir);
	assert_int_equal(idem_store_open(&store, url, NULL), IDEM_EUNAVAIL);
	assert_null(store);
	assert_int_equal(idem_error_last()->driver_code & 0xff, SQLITE_CANTOPEN);
	/* A parent of the path is a regular file. */
	snprintf(file, sizeof(file), "%s/plain", dir);
	fd = open(file, O_CREAT | O_WRONLY, 0600);
	assert_true(fd >= 0);
	close(fd);
	snprintf(url, sizeof(url), "sqlite:%s/plain/idem.db", dir);
	assert_int_equal(idem_store_open(&store, url, NULL), IDEM_EUNAVAIL);
	assert_null(store);
	assert_true(strlen(idem_error_last()->message) > 0);
	unlink(file);
	rmdir(dir);
}

static int noop_unit(idem_txn *txn, void *ctx, idem_response *resp)
{
	(void)txn;
	(*(int *)ctx)++;
	return idem_response_set(resp, 201, "x", 1);
}

/*
 * Another process holds the write lock past our busy timeout: the claim is
 * a retryable error, never a duplicate, and leaves the key free.
 */
static void locked_database_is_an_error(void **state)
{
	char *url = test_db_url();
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *store = NULL;
	idem_request r = IDEM_REQUEST_INIT;
	idem_result res = {0};
	sqlite3 *other = NULL;
	char fp[65];
	int calls = 0;

	(void)state;
	opts.busy_timeout_ms = 20;
	opts.max_retries = 2;
	assert_int_equal(idem_store_open(&store, url, &opts), 0);
	assert_int_equal(sqlite3_open(path_of(url), &other), SQLITE_OK);
	assert_int_equal(sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);

	payment_request(&r, fp, "locked");
	assert_int_equal(idem_execute(&res, store, &r, noop_unit, &calls), IDEM_ERETRY);
	assert_int_equal(res.outcome, 0);
	assert_int_equal(calls, 0);
	assert_int_equal(idem_error_last()->driver_code & 0xff, SQLITE_BUSY);
	assert_true(idem_metrics_store_errors(store, IDEM_ECLASS_RETRYABLE) >= 1);

	assert_int_equal(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(other);
	assert_int_equal(idem_execute(&res, store, &r, noop_unit, &calls), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	assert_int_equal(calls, 1);
	idem_result_clear(&res);
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

static void newer_schema_is_refused(void **state)
{
	char *url = test_db_url();
	idem_store *store = test_store_open(url, NULL);
	sqlite3 *db = NULL;

	(void)state;
	idem_store_close(store);
	assert_int_equal(sqlite3_open(path_of(url), &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db,
	                              "INSERT INTO idem_schema_version (version, applied_at)"
	                              " VALUES (999, 0)",
	                              NULL, NULL, NULL),
	                 SQLITE_OK);
	sqlite3_close(db);
	store = (idem_store *)1;
	assert_int_equal(idem_store_open(&store, url, NULL), IDEM_ESCHEMA);
	assert_null(store);
	assert_non_null(strstr(idem_error_last()->message, "999"));
	test_db_drop(url);
	free(url);
}

/* Several processes open (and so migrate) one new database at once. */
static void migrations_race_across_processes(void **state)
{
	char *url = test_db_url();
	pid_t pids[4];
	idem_store *store;
	int64_t rows = -1;
	int v = -1;

	(void)state;
	for (int i = 0; i < 4; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			idem_store *s = NULL;
			int rc = idem_store_open(&s, url, NULL);

			if (rc != 0) /* say why: this race is the point of the test */
				fprintf(stderr, "child %d: open: %d %s\n", i, rc,
				        idem_error_last()->message);
			idem_store_close(s);
			_exit(rc == 0 ? 0 : 1);
		}
	}
	for (int i = 0; i < 4; i++) {
		int status = 0;

		assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	store = test_store_open(url, NULL);
	assert_int_equal(idem_store_schema_version(store, &v), 0);
	assert_int_equal(v, idem_store_schema_latest(store));
	assert_int_equal(idem_store_query(store, "SELECT count(*) FROM idem_schema_version", NULL,
	                                  0, test_first_int, &rows),
	                 0);
	assert_int_equal(rows, idem_store_schema_latest(store));
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

/* Opened without migrating, the version is 0 and migrate brings it up. */
static void explicit_migrate(void **state)
{
	char *url = test_db_url();
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *store = NULL;
	int v = -1;

	(void)state;
	opts.migrate = 0;
	assert_int_equal(idem_store_open(&store, url, &opts), 0);
	assert_int_equal(idem_store_schema_version(store, &v), 0);
	assert_int_equal(v, 0);
	assert_int_equal(idem_store_migrate(store, &v), 0);
	assert_int_equal(v, idem_store_schema_latest(store));
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

/* ---- reads from inside a transaction (issue 13) ------------------------ */

static int count_in_txn(idem_txn *txn, void *ctx)
{
	int64_t *n = ctx;

	/* The unit's own read through the store, not through txn. */
	return idem_store_query(idem_txn_store(txn), "SELECT count(*) FROM idem_records", NULL, 0,
	                        idem_row_int, n);
}

static int count_in_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	int rc = count_in_txn(txn, ctx);

	return rc < 0 ? rc : idem_response_set(resp, 200, "ok", 2);
}

/*
 * With no reader connection the writer answers reads; a read made from
 * inside the thread's own transaction used to take the writer lock again
 * and hang for ever. alarm() turns such a hang into a failed test.
 */
static void read_inside_txn_without_readers(const char *url, int batch)
{
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_request r = IDEM_REQUEST_INIT;
	idem_result res = {0};
	idem_store *store = NULL;
	int64_t n = -1;
	char fp[65];

	opts.read_connections = 0;
	opts.batch_max = batch;
	alarm(20);
	assert_int_equal(idem_store_open(&store, url, &opts), 0);
	assert_int_equal(idem_store_transact(store, count_in_txn, &n), 0);
	assert_int_equal(n, 0);
	payment_request(&r, fp, "k");
	n = -1;
	assert_int_equal(idem_execute(&res, store, &r, count_in_work, &n), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	/* The writer is the only connection: the read sees the unit's own claim. */
	assert_int_equal(n, 1);
	idem_result_clear(&res);
	/* Outside any transaction the store still reads (and the lock was freed). */
	assert_int_equal(
	    idem_store_query(store, "SELECT count(*) FROM idem_records", NULL, 0, idem_row_int, &n),
	    0);
	assert_int_equal(n, 1);
	idem_store_close(store);
	alarm(0);
}

static void memory_read_inside_txn(void **state)
{
	(void)state;
	read_inside_txn_without_readers("sqlite::memory:", 1);
	read_inside_txn_without_readers("sqlite::memory:", 8); /* on the group-commit writer */
}

static void zero_readers_read_inside_txn(void **state)
{
	(void)state;
	for (int batch = 1; batch <= 8; batch += 7) {
		char *url = test_db_url();

		read_inside_txn_without_readers(url, batch);
		test_db_drop(url);
		free(url);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(durable_by_default),
	    cmocka_unit_test(memory_store),
	    cmocka_unit_test(not_a_database),
	    cmocka_unit_test(unopenable_paths),
	    cmocka_unit_test(locked_database_is_an_error),
	    cmocka_unit_test(newer_schema_is_refused),
	    cmocka_unit_test(migrations_race_across_processes),
	    cmocka_unit_test(explicit_migrate),
	    cmocka_unit_test(memory_read_inside_txn),
	    cmocka_unit_test(zero_readers_read_inside_txn),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
