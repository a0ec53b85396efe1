/*
 * tests/store/test_postgres.c: what is particular to the PostgreSQL
 * dialect: text that cannot carry a NUL byte. What both server backends
 * share (URL schemes, value types and `?` placeholders, SQLSTATEs kept
 * beside the idem code, a failed statement leaving the transaction usable,
 * keys compared byte for byte, killed sessions, a server that stops
 * answering, deadlines, schema refusal, racing migrations) is in
 * test_netdb.c, run on each.
 * Needs the server db-up.sh starts; skipped with a message without it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

/* Text cannot carry NUL in PostgreSQL: refused as bad input, never
 * truncated at the NUL. */
static void text_with_nul_is_refused(void **state)
{
	test_net_fixture *f = test_net_open(state, "postgres", 1);
	int64_t one = 0;

	assert_int_equal(
	    idem_store_query(f->store, "SELECT ?", &IDEM_V_TEXTN("a\0b", 3), 1, NULL, NULL),
	    IDEM_EINVAL);
	/* The store goes on. */
	assert_int_equal(idem_store_query(f->store, "SELECT 1", NULL, 0, test_first_int, &one), 0);
	assert_int_equal(one, 1);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, test_net_setup, test_net_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
	    T(text_with_nul_is_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
