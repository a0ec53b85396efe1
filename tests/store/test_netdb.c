/*
 * tests/store/test_netdb.c: the behaviour both server backends (PostgreSQL,
 * MariaDB) must share, written once and run on each: ctest runs it as
 * test_netdb_postgres and test_netdb_mariadb (argv[1] names the backend).
 * What only one dialect has stays in test_postgres.c / test_mariadb.c.
 * Needs the server db-up.sh starts; skipped with a message without it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static const char *backend; /* "postgres" or "mariadb" */

typedef struct {
	char *url;
	idem_store *store;
	char scope[40];
} fixture;

static int setup(void **state)
{
	*state = calloc(1, sizeof(fixture));
	return 0;
}

/* Done in each test body, where skip() works (it does not in a setup). */
static fixture *open_fixture(void **state)
{
	fixture *f = *state;

	(void)test_server_admin_url(backend);
	setenv("IDEM_TEST_URL", backend, 1);
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

static int first_int(void *ctx, const idem_value *cols, int n)
{
	*(int64_t *)ctx = n > 0 && cols[0].type == IDEM_VAL_INT ? cols[0].i : -1;
	return 1;
}

typedef struct {
	const char *sql;
} unit;

static int unit_fn(idem_txn *txn, void *ctx, idem_response *resp)
{
	unit *u = ctx;
	int rc;

	if ((rc = idem_txn_exec(txn, u->sql, NULL, 0, NULL)) < 0)
		return rc;
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
	return idem_execute(res, f->store, &r, unit_fn, u);
}

/*
 * A value out of its column's range (PostgreSQL 22003, MariaDB 1264 and
 * 1690) is the request's fault and permanent: never "store unavailable",
 * which would make every client retry a request that can never succeed
 * (issue 16). It is IDEM_EINVAL, nothing is committed, the store still works.
 */
static void numeric_range_is_invalid(void **state)
{
	fixture *f = open_fixture(state);
	unit u = {"INSERT INTO work_log (scope, k, worker) VALUES ('s', 'x', 3000000000)"};
	idem_result res = {0};
	idem_record_info info;
	int64_t n = 0;
	int rc;

	rc = run_unit(f, "K", &u, &res);
	assert_int_equal(rc, IDEM_EINVAL);
	assert_int_not_equal(idem_error_classify(rc), IDEM_ECLASS_UNAVAILABLE);
	if (strcmp(backend, "postgres") == 0)
		assert_string_equal(idem_error_last()->sqlstate, "22003");
	else
		assert_int_equal(idem_error_last()->driver_code, 1264);
	assert_int_equal(res.outcome, 0);
	assert_int_equal(idem_record_get(&info, f->store, f->scope, "payment", "K", 1),
	                 IDEM_ENOTFOUND);
	/* In an expression, on a read connection. */
	rc = idem_store_query(f->store, "SELECT 9223372036854775807 + 1", NULL, 0, first_int, &n);
	assert_int_equal(rc, IDEM_EINVAL);
	if (strcmp(backend, "postgres") == 0)
		assert_string_equal(idem_error_last()->sqlstate, "22003");
	else
		assert_int_equal(idem_error_last()->driver_code, 1690);
	assert_int_equal(idem_store_ping(f->store), 0);
	assert_int_equal(run_unit(f, "K2",
	                          &(unit){"INSERT INTO work_log (scope, k, worker)"
	                                  " VALUES ('s', 'x', 1)"},
	                          &res),
	                 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
}

/*
 * A connection given back to the pool while still inside a transaction is
 * out of step (a later unit would run inside that old transaction): it must
 * be dropped, never handed out again. A read that opens a transaction
 * leaves its connection so; the next read must be outside any transaction.
 */
static void connection_left_in_transaction_is_dropped(void **state)
{
	fixture *f = open_fixture(state);
	const char *session =
	    strcmp(backend, "postgres") == 0 ? "SELECT pg_backend_pid()" : "SELECT CONNECTION_ID()";
	int64_t before = -1, after = -1, again = -1;

	/* One thread's reads reuse one pooled connection (the last given back). */
	assert_int_equal(idem_store_query(f->store, session, NULL, 0, first_int, &before), 0);
	assert_int_equal(idem_store_query(f->store, session, NULL, 0, first_int, &again), 0);
	assert_true(before > 0);
	assert_int_equal(again, before);
	assert_int_equal(idem_store_query(f->store, "START TRANSACTION", NULL, 0, NULL, NULL), 0);
	assert_int_equal(idem_store_query(f->store, session, NULL, 0, first_int, &after), 0);
	assert_true(after > 0);
	assert_int_not_equal(after, before); /* that session was closed, a new one opened */
	if (strcmp(backend, "mariadb") == 0) {
		int64_t in = -1;

		assert_int_equal(
		    idem_store_query(f->store, "SELECT @@in_transaction", NULL, 0, first_int, &in),
		    0);
		assert_int_equal(in, 0);
	}
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
	    T(numeric_range_is_invalid),
	    T(connection_left_in_transaction_is_dropped),
	};

	backend = argc > 1 ? argv[1] : "postgres";
	if (strcmp(backend, "postgres") != 0 && strcmp(backend, "mariadb") != 0) {
		fprintf(stderr, "usage: test_netdb postgres|mariadb\n");
		return 2;
	}
	return cmocka_run_group_tests_name(backend, tests, NULL, NULL);
}
