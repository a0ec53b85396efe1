/*
 * tests/cli/testdb.c: a fresh, empty database for the Python CLI tests,
 * made exactly the way the C suites make theirs (tests/support:
 * test_db_url), so every backend's throwaway database has the same
 * collation and naming and test_db_drop only ever drops what was made here.
 *
 *   cli_testdb create        print a new database URL (IDEM_TEST_URL picks
 *                            the backend; exit 77 when its server is absent)
 *   cli_testdb drop URL      remove it again
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

int main(int argc, char **argv)
{
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
