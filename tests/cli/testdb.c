/*
 * tests/cli/testdb.c: a fresh, empty database for the Python CLI tests,
 * made exactly the way the C suites make theirs (tests/support:
 * test_db_url), so every backend's throwaway database has the same
 * collation and naming and test_db_drop only ever drops what was made here.
 *
 *   cli_testdb create        print a new database URL (IDEM_TEST_URL picks
 *                            the backend; exit 77 when its server is absent)
 *   cli_testdb drop URL      remove it again
 *   cli_testdb exec URL SQL [TEXT...]
 *                            run one statement with TEXT parameters (bytes
 *                            as given) in a transaction: how a test puts a
 *                            row the API refuses (an old bad name) on any
 *                            backend
 *   cli_testdb query URL SQL [TEXT...]
 *                            print the first column of each row, one a line
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

typedef struct {
	const char *sql;
	idem_value p[8];
	int n;
} stmt;

static int exec_fn(idem_txn *txn, void *ctx)
{
	stmt *st = ctx;

	return idem_txn_exec(txn, st->sql, st->p, st->n, NULL);
}

static int print_row(void *ctx, const idem_value *c, int n)
{
	(void)ctx;
	if (n < 1 || c[0].type == IDEM_VAL_NULL)
		printf("\n");
	else if (c[0].type == IDEM_VAL_INT)
		printf("%lld\n", (long long)c[0].i);
	else
		printf("%.*s\n", (int)c[0].len, (const char *)c[0].p);
	return 0;
}

static int run_sql(int query, int argc, char **argv)
{
	idem_store_opts o = IDEM_STORE_OPTS_INIT;
	idem_store *store = NULL;
	stmt st = {argv[3], {{0}}, 0};
	int rc;

	if (argc - 4 > 8)
		return 2;
	for (int i = 4; i < argc; i++)
		st.p[st.n++] = IDEM_V_TEXT(argv[i]);
	o.migrate = 0;
	if ((rc = idem_store_open(&store, argv[2], &o)) < 0) {
		fprintf(stderr, "cli_testdb: open: %s\n", idem_error_last()->message);
		return 1;
	}
	rc = query ? idem_store_query(store, st.sql, st.p, st.n, print_row, NULL)
	           : idem_store_transact(store, exec_fn, &st);
	if (rc < 0)
		fprintf(stderr, "cli_testdb: %s\n", idem_error_last()->message);
	idem_store_close(store);
	return rc < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && (strcmp(argv[1], "exec") == 0 || strcmp(argv[1], "query") == 0))
		return run_sql(argv[1][0] == 'q', argc, argv);
	if (argc == 2 && strcmp(argv[1], "create") == 0) {
		char *url = test_db_url();

		printf("%s\n", url);
		free(url);
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "drop") == 0) {
		test_db_drop(argv[2]);
		return 0;
	}
	fprintf(stderr, "usage: cli_testdb create | drop URL\n");
	return 2;
}
