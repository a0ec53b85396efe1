/*
 * tests/store/test_mariadb.c: what is particular to the MariaDB backend:
 * its own URL parser (percent-decoded password: db-up.sh's has '@', ':',
 * '/', '%' and a space; each malformed part refused), a wrong password
 * unavailable and never echoed, and a half-done (non-transactional DDL)
 * migration rerun. What both server backends share (URL schemes, value
 * types, keys compared byte for byte, NOT NULL, CHECK and strict-mode
 * errors that are never duplicates, UPDATE seeing old values, killed
 * sessions, a server that stops answering, deadlines, schema refusal,
 * racing migrations) is in test_netdb.c, run on each.
 * Needs the server db-up.sh starts; skipped with a message without it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

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
	/* A wrong password is unavailable, and not repeated in the message. */
	snprintf(url, sizeof(url), "mysql://idem:wrong@%s", strchr(f->url, '@') + 1);
	assert_int_equal(idem_store_open(&s, url, NULL), IDEM_EUNAVAIL);
	assert_int_equal(idem_error_last()->driver_code, 1045);
	assert_null(strstr(idem_error_last()->message, "wrong"));
}

static int forget_versions(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_exec(txn, "DELETE FROM idem_schema_version", NULL, 0, NULL);
}

/* A migration that died after its DDL but before recording it reruns:
 * MariaDB's DDL is not transactional, so the tables can be there with no
 * version row saying so. */
static void half_done_migration_reruns(void **state)
{
	test_net_fixture *f = test_net_open(state, "mariadb", 1);
	int v = -1;

	assert_int_equal(idem_store_transact(f->store, forget_versions, NULL), 0);
	idem_store_close(f->store);
	f->store = test_store_open(f->url, NULL);
	assert_int_equal(idem_store_schema_version(f->store, &v), 0);
	assert_int_equal(v, idem_store_schema_latest(f->store));
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, test_net_setup, test_net_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
	    T(urls),
	    T(half_done_migration_reruns),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
