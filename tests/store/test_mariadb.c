/*
 * tests/store/test_mariadb.c: what is particular to the MariaDB backend:
 * URL parsing (percent-decoded password: db-up.sh's has '@', ':', '/', '%'
 * and a space), keys that collations would fold or pad (A1, a1, 'A1 ') kept
 * distinct by the idempotency index itself, NOT NULL and strict-mode errors
 * that are errors and never duplicates, value types, UPDATE seeing old
 * values, a half-done (non-transactional DDL) migration rerun. What both
 * server backends share (killed sessions, a server that stops answering,
 * deadlines, schema refusal, racing migrations) is in test_netdb.c, run on
 * each. Needs the server db-up.sh starts; skipped with a message without it.
 */
#include <mysql.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/mariadb.h"
#include "support.h"

/* A statement on the test's database, outside the store under test. */
static void direct(const test_net_fixture *f, const char *sql)
{
	MYSQL *my = idem__mariadb_connect(f->url);

	if (!my)
		fail_msg("connect: %s", idem_error_last()->message);
	if (mysql_query(my, sql) != 0)
		fail_msg("%s: %s", sql, mysql_error(my));
	mysql_close(my);
}

typedef struct {
	const char *scope, *key;
	const char *sql; /* instead of the work_log insert */
	int calls;
} unit;

static int unit_fn(idem_txn *txn, void *ctx, idem_response *resp)
{
	unit *u = ctx;
	idem_value p[3] = {IDEM_V_TEXT(u->scope), IDEM_V_TEXT(u->key), IDEM_V_INT(1)};
	const char *ins = "INSERT INTO work_log (scope, k, worker) VALUES (?, ?, ?)";
	int rc;

	u->calls++;
	if ((rc = idem_txn_exec(txn, u->sql ? u->sql : ins, p, u->sql ? 0 : 3, NULL)) < 0)
		return rc;
	return idem_response_set(resp, 201, "made", 4);
}

static int run_unit(test_net_fixture *f, const char *key, unit *u, idem_result *res)
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

static void urls(void **state)
{
	test_net_fixture *f = test_net_open(state, "mariadb", 1);
	const char *bad[] = {
	    "mysql://idem@127.0.0.1:3306",         /* no database */
	    "mysql://idem@127.0.0.1:3306/",        /* empty database */
	    "mysql://127.0.0.1:3306/db",           /* no user */
	    "mysql://idem:p%zz@127.0.0.1/db",      /* bad escape */
	    "mysql://idem:p%00@127.0.0.1/db",      /* NUL */
	    "mysql://idem@127.0.0.1:99999/db",     /* port */
	    "mysql://idem@127.0.0.1:/db",          /* empty port */
	    "mysql://idem@[::1/db",                /* bracket */
	    "mysql://idem@127.0.0.1/db?user=root", /* unknown parameter */
	    "mysql://idem@127.0.0.1/a/b",          /* path */
	    "mysql:idem@127.0.0.1/db",             /* not a URL */
	};
	idem_store *s = (idem_store *)1;
	char url[512];

	/* The test_net_fixture opened on db-up.sh's URL, whose password needs decoding. */
	assert_string_equal(idem_store_backend(f->store), "mariadb");
	assert_non_null(strstr(f->url, "%40"));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (idem_store_open(&s, bad[i], NULL) != IDEM_EINVAL)
			fail_msg("%s: not refused as invalid", bad[i]);
		assert_null(s);
	}
	/* mariadb:// is the same store; a wrong password is unavailable. */
	snprintf(url, sizeof(url), "mariadb%s", strchr(f->url, ':'));
	assert_int_equal(idem_store_open(&s, url, NULL), 0);
	idem_store_close(s);
	snprintf(url, sizeof(url), "mysql://idem:wrong@%s", strchr(f->url, '@') + 1);
	assert_int_equal(idem_store_open(&s, url, NULL), IDEM_EUNAVAIL);
	assert_int_equal(idem_error_last()->driver_code, 1045);
	assert_null(strstr(idem_error_last()->message, "wrong"));
	assert_int_equal(idem_store_open(&s, "mysql://idem@127.0.0.1:1/db", NULL), IDEM_EUNAVAIL);
}

static int insert_keys(idem_txn *txn, void *ctx)
{
	const char *keys[] = {"A1", "a1", "A1 ", "A1\t", " A1"};
	int rc;

	(void)ctx;
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		idem_value p[2] = {IDEM_V_TEXT(keys[i]), IDEM_V_INT(i)};

		rc = idem_txn_exec(
		    txn,
		    "INSERT INTO idem_records (scope, business_type, idem_key, version,"
		    " status, fingerprint, created_at, expires_at)"
		    " VALUES ('s', 'payment', ?, 1, 'SUCCEEDED', 'f', ?, 0)",
		    p, 2, NULL);
		if (rc < 0)
			return rc;
	}
	/* The same bytes again: the idempotency index refuses it. */
	rc = idem_txn_exec(txn,
	                   "INSERT INTO idem_records (scope, business_type, idem_key, version,"
	                   " status, fingerprint, created_at, expires_at)"
	                   " VALUES ('s', 'payment', 'A1', 1, 'SUCCEEDED', 'f', 9, 0)",
	                   NULL, 0, NULL);
	assert_int_equal(rc, IDEM_ECONFLICT);
	assert_int_equal(idem_error_last()->driver_code, 1062);
	return 0;
}

/*
 * Keys compare byte for byte in the idempotency index itself: not
 * case-folded (a _ci collation would), not padded (utf8mb4_bin would make
 * 'A1 ' equal 'A1').
 */
static void keys_are_bytes(void **state)
{
	test_net_fixture *f = test_net_open(state, "mariadb", 1);
	unit u = {0};
	idem_result res = {0};
	int64_t n = -1;

	assert_int_equal(idem_store_transact(f->store, insert_keys, NULL), 0);
	assert_int_equal(idem_store_query(f->store,
	                                  "SELECT count(*) FROM idem_records WHERE scope = 's'"
	                                  " AND business_type = 'payment' AND idem_key = ?",
	                                  &IDEM_V_TEXT("A1"), 1, test_first_int, &n),
	                 0);
	assert_int_equal(n, 1);
	/* Through the claim path too. */
	assert_int_equal(run_unit(f, "A1", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(run_unit(f, "a1", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(run_unit(f, "A1", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	idem_result_clear(&res);
	assert_int_equal(u.calls, 2);
}

/* NOT NULL, CHECK and strict-mode failures are errors, never duplicates. */
static void constraint_errors_are_not_duplicates(void **state)
{
	test_net_fixture *f = test_net_open(state, "mariadb", 1);
	unit u = {0};
	idem_result res = {0};
	idem_record_info info;
	char sql[600];

	u.sql = "INSERT INTO work_log (scope, k, worker) VALUES (NULL, 'x', 1)";
	assert_int_equal(run_unit(f, "K", &u, &res), IDEM_ECONSTRAINT);
	assert_int_equal(idem_error_last()->driver_code, 1048);
	assert_int_equal(res.outcome, 0);
	u.sql = "INSERT INTO work_log (scope, k, worker) VALUES ('s', 'x', -1)";
	assert_int_equal(run_unit(f, "K", &u, &res), IDEM_ECONSTRAINT);
	assert_int_equal(idem_error_last()->driver_code, 4025);
	/* STRICT_ALL_TABLES: a value too long is refused, not truncated. */
	snprintf(sql, sizeof(sql),
	         "INSERT INTO work_log (scope, k, worker) VALUES ('%0300d', 'x', 1)", 0);
	u.sql = sql;
	assert_int_equal(run_unit(f, "K", &u, &res), IDEM_ESTORE);
	assert_int_equal(idem_error_last()->driver_code, 1406);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "K", 1),
	                 IDEM_ENOTFOUND);
	u.sql = NULL;
	assert_int_equal(run_unit(f, "K", &u, &res), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(test_work_count(f->store, f->scope, "K"), 1);
}

static int make_types(idem_txn *txn, void *ctx)
{
	static const unsigned char bytes[] = {'a', 0, 0xff, '?', 'z'};
	idem_value p[4] = {IDEM_V_INT(-9007199254740993LL), IDEM_V_TEXT("it's ?"),
	                   IDEM_V_BLOB(bytes, sizeof(bytes)), IDEM_V_NULL};
	int rc;

	(void)ctx;
	if ((rc = idem_txn_exec(txn, "CREATE TABLE typed (i BIGINT, t TEXT, b BLOB, n INTEGER)",
	                        NULL, 0, NULL)) < 0)
		return rc;
	return idem_txn_exec(txn, "INSERT INTO typed (i, t, b, n) VALUES (?, ?, ?, ?)", p, 4, NULL);
}

static void value_types(void **state)
{
	test_net_fixture *f = test_net_open(state, "mariadb", 1);
	static const unsigned char bytes[] = {'a', 0, 0xff, '?', 'z'};
	test_row r = {0};

	assert_int_equal(idem_store_transact(f->store, make_types, NULL), 0);
	assert_int_equal(idem_store_query(f->store,
	                                  "SELECT i, t, b, n, sum(i), 'x' FROM typed WHERE t = ?",
	                                  &IDEM_V_TEXT("it's ?"), 1, test_copy_row, &r),
	                 0);
	assert_int_equal(r.n, 6);
	assert_int_equal(r.v[0].type, IDEM_VAL_INT);
	assert_true(r.v[0].i == -9007199254740993LL);
	assert_string_equal(r.text[1], "it's ?");
	assert_int_equal(r.v[2].type, IDEM_VAL_BLOB);
	assert_int_equal(r.v[2].len, sizeof(bytes));
	assert_memory_equal(r.blob, bytes, sizeof(bytes));
	assert_int_equal(r.v[3].type, IDEM_VAL_NULL);
	/* SUM() is DECIMAL in MariaDB: still an integer to callers. */
	assert_int_equal(r.v[4].type, IDEM_VAL_INT);
	assert_true(r.v[4].i == -9007199254740993LL);
	assert_int_equal(r.v[5].type, IDEM_VAL_TEXT);
	assert_int_equal(idem_store_query(f->store, "SELECT ?, ?", &IDEM_V_INT(1), 1, NULL, NULL),
	                 IDEM_EINVAL);
}

static int update_both(idem_txn *txn, void *ctx)
{
	int rc;

	(void)ctx;
	if ((rc = idem_txn_exec(txn, "CREATE TABLE acc (a BIGINT NOT NULL, b VARCHAR(8) NOT NULL)",
	                        NULL, 0, NULL)) < 0 ||
	    (rc = idem_txn_exec(txn, "INSERT INTO acc (a, b) VALUES (1, 'x')", NULL, 0, NULL)) < 0)
		return rc;
	return idem_txn_exec(txn,
	                     "UPDATE acc SET a = a + ?, b = CASE WHEN a + ? = 3 THEN 'full'"
	                     " ELSE 'part' END",
	                     (idem_value[]){IDEM_V_INT(2), IDEM_V_INT(2)}, 2, NULL);
}

/*
 * The SET list of an UPDATE sees the row's old values, as on SQLite and
 * PostgreSQL (left to right, b would see a = 3 and say 'part').
 */
static void update_sees_old_values(void **state)
{
	test_net_fixture *f = test_net_open(state, "mariadb", 1);
	test_row r = {0};

	assert_int_equal(idem_store_transact(f->store, update_both, NULL), 0);
	assert_int_equal(
	    idem_store_query(f->store, "SELECT a, b FROM acc", NULL, 0, test_copy_row, &r), 0);
	assert_int_equal(r.v[0].i, 3);
	assert_string_equal(r.text[1], "full");
}

/* A migration that died after its DDL but before recording it reruns. */
static void half_done_migration_reruns(void **state)
{
	test_net_fixture *f = test_net_open(state, "mariadb", 1);
	int v = -1;

	idem_store_close(f->store);
	f->store = NULL;
	direct(f, "DELETE FROM idem_schema_version");
	f->store = test_store_open(f->url, NULL);
	assert_int_equal(idem_store_schema_version(f->store, &v), 0);
	assert_int_equal(v, idem_store_schema_latest(f->store));
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, test_net_setup, test_net_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
	    T(urls),        T(keys_are_bytes),         T(constraint_errors_are_not_duplicates),
	    T(value_types), T(update_sees_old_values), T(half_done_migration_reruns),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
