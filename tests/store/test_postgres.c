/*
 * tests/store/test_postgres.c: what is particular to the PostgreSQL
 * backend: both URL schemes, the `?` rewriting, value types, SQLSTATEs kept
 * beside the idem code, a failed business statement leaving the transaction
 * usable, connections killed under the store (never a duplicate, and the
 * store recovers by itself), and migrations racing from several processes.
 * Needs the server db-up.sh starts; skipped with a message without it.
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support.h"

typedef struct {
	char *url;
	idem_store *store;
	char scope[40];
} fixture;

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));

	*state = f;
	return 0;
}

/* Done in each test body, where skip() works (it does not in a setup). */
static fixture *open_fixture(void **state)
{
	fixture *f = *state;
	const char *admin = test_server_admin_url("postgres");

	(void)admin;
	setenv("IDEM_TEST_URL", "postgres", 1);
	f->url = test_db_url();
	f->store = test_store_open(f->url, NULL);
	test_scope(f->scope);
	test_create_work_log(f->store);
	return f;
}

static int teardown(void **state)
{
	fixture *f = *state;

	idem_store_close(f->store);
	if (f->url) {
		test_db_drop(f->url);
		free(f->url);
	}
	free(f);
	return 0;
}

/* An admin statement on the server, outside the store under test. */
static void admin(const char *sql)
{
	PGconn *pg = PQconnectdb(test_server_admin_url("postgres"));
	PGresult *res;

	if (PQstatus(pg) != CONNECTION_OK)
		fail_msg("admin connect: %s", PQerrorMessage(pg));
	res = PQexec(pg, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
		fail_msg("%s: %s", sql, PQresultErrorMessage(res));
	PQclear(res);
	PQfinish(pg);
}

/* Terminate every session of the test's database: the store's pool dies. */
static void kill_all_sessions(const fixture *f)
{
	char sql[256];
	const char *db = strrchr(f->url, '/') + 1;

	snprintf(sql, sizeof(sql),
		 "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
		 " WHERE datname = '%s' AND pid <> pg_backend_pid()",
		 db);
	admin(sql);
}

typedef struct {
	const char *scope, *key;
	int calls;
	int kill_self; /* terminate our own session half way through the unit */
} unit;

static int first_int(void *ctx, const idem_value *cols, int n)
{
	*(int64_t *)ctx = n > 0 && cols[0].type == IDEM_VAL_INT ? cols[0].i : -1;
	return 1;
}

static int unit_fn(idem_txn *txn, void *ctx, idem_response *resp)
{
	unit *u = ctx;
	idem_value p[3] = {IDEM_V_TEXT(u->scope), IDEM_V_TEXT(u->key), IDEM_V_INT(1)};
	int rc;

	u->calls++;
	if ((rc = idem_txn_exec(txn, "INSERT INTO work_log (scope, k, worker) VALUES (?, ?, ?)", p,
				3, NULL)) < 0)
		return rc;
	if (u->kill_self) {
		int64_t pid = -1;
		char sql[128];

		assert_int_equal(idem_txn_query(txn, "SELECT pg_backend_pid()", NULL, 0, first_int,
						&pid),
				 0);
		snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%lld)", (long long)pid);
		admin(sql);
		u->kill_self = 0;
		/* The next statement finds the session gone. */
		if ((rc = idem_txn_exec(txn, "INSERT INTO work_log (scope, k, worker) VALUES (?, ?, ?)",
					p, 3, NULL)) < 0)
			return rc;
	}
	return idem_response_set(resp, 201, "made", 4);
}

static int run_unit(fixture *f, const char *key, unit *u, idem_result *res)
{
	idem_request r = IDEM_REQUEST_INIT;
	char fp[65];

	test_fp(fp, "{}");
	r.scope = f->scope;
	r.business_type = "payment";
	r.key = key;
	r.key_len = strlen(key);
	r.fingerprint = fp;
	u->scope = f->scope;
	u->key = key;
	return idem_execute(res, f->store, &r, unit_fn, u);
}

static void backend_and_schemes(void **state)
{
	fixture *f = open_fixture(state);
	idem_store *s = NULL;
	char *url = strdup(f->url);

	assert_string_equal(idem_store_backend(f->store), "postgresql");
	/* postgres:// is the same store. */
	assert_int_equal(strncmp(url, "postgresql://", 13), 0);
	memmove(url + 8, url + 10, strlen(url + 10) + 1);
	assert_int_equal(strncmp(url, "postgres://", 11), 0);
	assert_int_equal(idem_store_open(&s, url, NULL), 0);
	assert_string_equal(idem_store_backend(s), "postgresql");
	idem_store_close(s);
	free(url);
	/* Bad URLs are bad input, an absent server is unavailable. */
	s = (idem_store *)1;
	assert_int_equal(idem_store_open(&s, "postgresql://a@b/x?nosuchparam=1", NULL),
			 IDEM_EINVAL);
	assert_null(s);
	assert_int_equal(idem_store_open(&s, "postgresql:idem@127.0.0.1/x", NULL), IDEM_EINVAL);
	assert_int_equal(idem_store_open(&s, "postgresql://idem@127.0.0.1:1/x", NULL),
			 IDEM_EUNAVAIL);
	assert_null(s);
}

typedef struct {
	idem_value v[8];
	int n;
	unsigned char blob[8];
	char text[8][32];
} row_copy;

static int copy_row(void *ctx, const idem_value *cols, int n)
{
	row_copy *r = ctx;

	r->n = n;
	for (int i = 0; i < n && i < 8; i++) {
		r->v[i] = cols[i];
		if (cols[i].type == IDEM_VAL_BLOB) {
			assert_true(cols[i].len <= sizeof(r->blob));
			memcpy(r->blob, cols[i].p, cols[i].len);
		} else if (cols[i].type == IDEM_VAL_TEXT) {
			snprintf(r->text[i], sizeof(r->text[i]), "%.*s", (int)cols[i].len,
				 (const char *)cols[i].p);
		}
	}
	return 1;
}

static int make_types(idem_txn *txn, void *ctx)
{
	static const unsigned char bytes[] = {'a', 0, 0xff, '?', 'z'};
	idem_value p[4] = {IDEM_V_INT(-9007199254740993LL), IDEM_V_TEXT("it's ?"),
			   IDEM_V_BLOB(bytes, sizeof(bytes)), IDEM_V_NULL};
	int rc;

	(void)ctx;
	if ((rc = idem_txn_exec(txn,
				"CREATE TABLE typed (i BIGINT, t TEXT, b BYTEA, n INTEGER,"
				" note TEXT DEFAULT 'what? no')",
				NULL, 0, NULL)) < 0)
		return rc;
	/* '?' in a literal and a comment is not a placeholder. */
	return idem_txn_exec(txn,
			     "INSERT INTO typed (i, t, b, n, note) /* why? */"
			     " VALUES (?, ?, ?, ?, 'really?') -- or?\n",
			     p, 4, NULL);
}

static void placeholders_and_types(void **state)
{
	fixture *f = open_fixture(state);
	static const unsigned char bytes[] = {'a', 0, 0xff, '?', 'z'};
	row_copy r = {0};

	assert_int_equal(idem_store_transact(f->store, make_types, NULL), 0);
	assert_int_equal(idem_store_query(f->store,
					  "SELECT i, t, b, n, note, i + 1, sum(i) OVER (), true"
					  " FROM typed WHERE t = ? AND note = 'really?'",
					  &IDEM_V_TEXT("it's ?"), 1, copy_row, &r),
			 0);
	assert_int_equal(r.n, 8);
	assert_int_equal(r.v[0].type, IDEM_VAL_INT);
	assert_true(r.v[0].i == -9007199254740993LL);
	assert_int_equal(r.v[1].type, IDEM_VAL_TEXT);
	assert_string_equal(r.text[1], "it's ?");
	assert_int_equal(r.v[2].type, IDEM_VAL_BLOB);
	assert_int_equal(r.v[2].len, sizeof(bytes));
	assert_memory_equal(r.blob, bytes, sizeof(bytes));
	assert_int_equal(r.v[3].type, IDEM_VAL_NULL);
	assert_string_equal(r.text[4], "really?");
	assert_true(r.v[5].i == -9007199254740992LL);
	/* sum(bigint) is numeric in PostgreSQL: still an integer to callers. */
	assert_int_equal(r.v[6].type, IDEM_VAL_INT);
	assert_int_equal(r.v[7].type, IDEM_VAL_INT);
	assert_int_equal(r.v[7].i, 1);
	/* Placeholder count is checked before anything runs. */
	assert_int_equal(idem_store_query(f->store, "SELECT ?, ?", &IDEM_V_INT(1), 1, NULL, NULL),
			 IDEM_EINVAL);
	/* Text cannot carry NUL in PostgreSQL: refused, not truncated. */
	assert_int_equal(idem_store_query(f->store, "SELECT ?", &IDEM_V_TEXTN("a\0b", 3), 1, NULL,
					  NULL),
			 IDEM_EINVAL);
}

static int make_uniq(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_exec(txn, "CREATE TABLE orders (no TEXT NOT NULL UNIQUE)", NULL, 0, NULL);
}

/*
 * After a failed idem_txn_try_exec the unit's transaction goes on, as on
 * SQLite (plain idem_txn_exec saves the round trips and leaves the
 * transaction to the unit's savepoint instead).
 */
static int conflict_then_continue(idem_txn *txn, void *ctx)
{
	int64_t n = 0;
	int rc;

	(void)ctx;
	rc = idem_txn_try_exec(txn, "INSERT INTO orders (no) VALUES ('o1')", NULL, 0, NULL);
	assert_int_equal(rc, IDEM_ECONFLICT);
	assert_string_equal(idem_error_last()->sqlstate, "23505");
	rc = idem_txn_try_exec(txn, "INSERT INTO orders (no) VALUES (NULL)", NULL, 0, NULL);
	assert_int_equal(rc, IDEM_ECONSTRAINT);
	assert_string_equal(idem_error_last()->sqlstate, "23502");
	assert_int_equal(idem_txn_try_exec(txn, "INSERT INTO nowhere VALUES (1)", NULL, 0, NULL),
			 IDEM_ESTORE);
	assert_string_equal(idem_error_last()->sqlstate, "42P01");
	if ((rc = idem_txn_exec(txn, "INSERT INTO orders (no) VALUES ('o2')", NULL, 0, NULL)) < 0)
		return rc;
	if ((rc = idem_txn_query(txn, "SELECT count(*) FROM orders", NULL, 0, first_int, &n)) < 0)
		return rc;
	assert_int_equal(n, 2);
	return 0;
}

static int insert_o1(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_exec(txn, "INSERT INTO orders (no) VALUES ('o1')", NULL, 0, NULL);
}

static void failed_statement_keeps_transaction(void **state)
{
	fixture *f = open_fixture(state);
	int64_t n = 0;

	assert_int_equal(idem_store_transact(f->store, make_uniq, NULL), 0);
	assert_int_equal(idem_store_transact(f->store, insert_o1, NULL), 0);
	assert_int_equal(idem_store_transact(f->store, conflict_then_continue, NULL), 0);
	assert_int_equal(idem_store_query(f->store, "SELECT count(*) FROM orders", NULL, 0,
					  first_int, &n),
			 0);
	assert_int_equal(n, 2);
}

/*
 * Every session of the store is terminated while idle: the next call
 * reconnects by itself (or says unavailable), never answers a duplicate,
 * and the one after certainly works.
 */
static void killed_idle_connections_recover(void **state)
{
	fixture *f = open_fixture(state);
	unit u = {0};
	idem_result res = {0};
	int rc;

	assert_int_equal(run_unit(f, "before", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	kill_all_sessions(f);

	rc = run_unit(f, "before", &u, &res);
	assert_true(rc == 0 || rc == IDEM_EUNAVAIL);
	if (rc == 0)
		assert_int_equal(res.outcome, IDEM_REPLAY);
	idem_result_clear(&res);
	rc = run_unit(f, "after", &u, &res);
	assert_true(rc == 0 || rc == IDEM_EUNAVAIL);
	idem_result_clear(&res);
	assert_int_equal(run_unit(f, "after2", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(idem_store_ping(f->store), 0);
	assert_int_equal(test_work_count(f->store, f->scope, "before"), 1);
}

/*
 * The session dies in the middle of a unit: the unit fails as unavailable
 * (never a duplicate, never retried as if it were a lock conflict), nothing
 * of it is committed, and the key is free for the retry.
 */
static void killed_mid_unit_is_unavailable(void **state)
{
	fixture *f = open_fixture(state);
	unit u = {.kill_self = 1};
	idem_result res = {0};
	idem_record_info info;

	assert_int_equal(run_unit(f, "K", &u, &res), IDEM_EUNAVAIL);
	assert_int_equal(res.outcome, 0);
	assert_int_equal(u.calls, 1);
	assert_int_equal(idem_error_last()->code, IDEM_EUNAVAIL);
	assert_true(idem_metrics_store_errors(f->store, IDEM_ECLASS_UNAVAILABLE) >= 1);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "K", 1),
			 IDEM_ENOTFOUND);
	assert_int_equal(test_work_count(f->store, f->scope, "K"), 0);
	assert_int_equal(run_unit(f, "K", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(test_work_count(f->store, f->scope, "K"), 1);
}

static int sleep_long(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_query(txn, "SELECT pg_sleep(?)", &IDEM_V_INT(13), 1, NULL, NULL);
}

/*
 * A server that stops answering (here: a statement that outlives the
 * store's bound of busy_timeout_ms + 10 s, as a SIGSTOPped server would)
 * fails the call as unavailable instead of hanging it, and the store goes
 * on with a new connection.
 */
static void unanswered_call_is_unavailable(void **state)
{
	fixture *f = open_fixture(state);
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *s = NULL;
	unit u = {0};
	idem_result res = {0};

	opts.busy_timeout_ms = 100;
	assert_int_equal(idem_store_open(&s, f->url, &opts), 0);
	assert_int_equal(idem_store_transact(s, sleep_long, NULL), IDEM_EUNAVAIL);
	assert_non_null(strstr(idem_error_last()->message, "did not answer"));
	assert_int_equal(idem_store_ping(s), 0);
	idem_store_close(s);
	assert_int_equal(run_unit(f, "after", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
}

static void newer_schema_is_refused(void **state)
{
	fixture *f = open_fixture(state);
	idem_store *s = (idem_store *)1;
	PGconn *pg = PQconnectdb(f->url);
	PGresult *res;

	assert_int_equal(PQstatus(pg), CONNECTION_OK);
	res = PQexec(pg, "INSERT INTO idem_schema_version (version, applied_at) VALUES (999, 0)");
	assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
	PQclear(res);
	PQfinish(pg);
	assert_int_equal(idem_store_open(&s, f->url, NULL), IDEM_ESCHEMA);
	assert_null(s);
	assert_non_null(strstr(idem_error_last()->message, "999"));
}

/* Several processes open (and so migrate) one new database at once. */
static void migrations_race_across_processes(void **state)
{
	fixture *f = *state;
	pid_t pids[4];
	int64_t rows = -1;
	int v = -1;

	(void)test_server_admin_url("postgres");
	setenv("IDEM_TEST_URL", "postgres", 1);
	f->url = test_db_url();
	for (int i = 0; i < 4; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			idem_store *s = NULL;
			int rc = idem_store_open(&s, f->url, NULL);

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
	f->store = test_store_open(f->url, NULL);
	assert_int_equal(idem_store_schema_version(f->store, &v), 0);
	assert_int_equal(v, idem_store_schema_latest(f->store));
	assert_int_equal(idem_store_query(f->store, "SELECT count(*) FROM idem_schema_version",
					  NULL, 0, first_int, &rows),
			 0);
	assert_int_equal(rows, idem_store_schema_latest(f->store));
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(backend_and_schemes),
		T(placeholders_and_types),
		T(failed_statement_keeps_transaction),
		T(killed_idle_connections_recover),
		T(killed_mid_unit_is_unavailable),
		T(unanswered_call_is_unavailable),
		T(newer_schema_is_refused),
		T(migrations_race_across_processes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
