/*
 * tests/store/test_postgres.c: what is particular to the PostgreSQL
 * dialect: both URL schemes, the `?` rewriting, value types, SQLSTATEs kept
 * beside the idem code, a failed business statement leaving the transaction
 * usable (a savepoint per statement). What both server backends share
 * (killed sessions, a server that stops answering, deadlines, schema
 * refusal, racing migrations) is in test_netdb.c, run on each.
 * Needs the server db-up.sh starts; skipped with a message without it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static void backend_and_schemes(void **state)
{
	test_net_fixture *f = test_net_open(state, "postgres", 1);
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
	test_net_fixture *f = test_net_open(state, "postgres", 1);
	static const unsigned char bytes[] = {'a', 0, 0xff, '?', 'z'};
	test_row r = {0};

	assert_int_equal(idem_store_transact(f->store, make_types, NULL), 0);
	assert_int_equal(idem_store_query(f->store,
	                                  "SELECT i, t, b, n, note, i + 1, sum(i) OVER (), true"
	                                  " FROM typed WHERE t = ? AND note = 'really?'",
	                                  &IDEM_V_TEXT("it's ?"), 1, test_copy_row, &r),
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
	assert_int_equal(
	    idem_store_query(f->store, "SELECT ?", &IDEM_V_TEXTN("a\0b", 3), 1, NULL, NULL),
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
	if ((rc = idem_txn_query(txn, "SELECT count(*) FROM orders", NULL, 0, test_first_int, &n)) <
	    0)
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
	test_net_fixture *f = test_net_open(state, "postgres", 1);
	int64_t n = 0;

	assert_int_equal(idem_store_transact(f->store, make_uniq, NULL), 0);
	assert_int_equal(idem_store_transact(f->store, insert_o1, NULL), 0);
	assert_int_equal(idem_store_transact(f->store, conflict_then_continue, NULL), 0);
	assert_int_equal(
	    idem_store_query(f->store, "SELECT count(*) FROM orders", NULL, 0, test_first_int, &n),
	    0);
	assert_int_equal(n, 2);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, test_net_setup, test_net_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
	    T(backend_and_schemes),
	    T(placeholders_and_types),
	    T(failed_statement_keeps_transaction),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
