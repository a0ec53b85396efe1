/* tests/core/test_fingerprint.c: the fingerprint and key validation. */
#include <string.h>

#include "support.h"

static void fp(char out[65], const char *path, const char *json)
{
	int rc = idem_fingerprint(out, "POST", path, json, strlen(json));

	if (rc != 0)
		fail_msg("fingerprint(%s): %s", json, idem_error_last()->message);
}

static void order_and_space_do_not_matter(void **state)
{
	char a[65], b[65], c[65];

	(void)state;
	fp(a, "/v1/payments",
	   "{\"amount\":1000,\"currency\":\"CNY\",\"meta\":{\"x\":1,\"y\":[1,2]}}");
	fp(b, "/v1/payments",
	   "{ \"meta\" : { \"y\" : [ 1 , 2 ], \"x\" : 1 },\n\t\"currency\": \"CNY\", \"amount\": "
	   "1000 }");
	fp(c, "/v1/payments",
	   "{\"currency\":\"CNY\",\"amount\":1000,\"meta\":{\"y\":[1,2],\"x\":1}}");
	assert_string_equal(a, b);
	assert_string_equal(a, c);
	assert_int_equal(strlen(a), 64);
}

static void changes_that_matter(void **state)
{
	char base[65], other[65];

	(void)state;
	fp(base, "/v1/payments", "{\"amount\":1000,\"currency\":\"CNY\"}");
	fp(other, "/v1/payments", "{\"amount\":1001,\"currency\":\"CNY\"}");
	assert_string_not_equal(base, other);
	fp(other, "/v1/refunds", "{\"amount\":1000,\"currency\":\"CNY\"}");
	assert_string_not_equal(base, other);
	/* Array order is data, not formatting. */
	fp(base, "/v1/x", "{\"a\":[1,2]}");
	fp(other, "/v1/x", "{\"a\":[2,1]}");
	assert_string_not_equal(base, other);
	/* A number and a string holding it differ. */
	fp(base, "/v1/x", "{\"a\":1}");
	fp(other, "/v1/x", "{\"a\":\"1\"}");
	assert_string_not_equal(base, other);
	assert_int_equal(idem_fingerprint(other, "PUT", "/v1/x", "{\"a\":1}", 7), 0);
	assert_string_not_equal(base, other);
}

static void parts_cannot_shift(void **state)
{
	char a[65], b[65];

	(void)state;
	/* Without length prefixes "POST"+"/ab" and "POST/"+"ab" would hash alike. */
	assert_int_equal(idem_fingerprint(a, "POST", "/ab", NULL, 0), 0);
	assert_int_equal(idem_fingerprint(b, "POST/", "ab", NULL, 0), 0);
	assert_string_not_equal(a, b);
}

static void unicode_escapes_are_canonical(void **state)
{
	char a[65], b[65];

	(void)state;
	fp(a, "/v1/x", "{\"d\":\"caf\xc3\xa9\"}");
	fp(b, "/v1/x", "{\"d\":\"caf\\u00e9\"}");
	assert_string_equal(a, b);
}

static void bad_json_is_rejected(void **state)
{
	char out[65];
	const char *bad[] = {
	    "{",       "{\"a\":1,}",        "{\"a\":1}{",
	    "{'a':1}", "{\"a\":1,\"a\":2}", "{\"a\":123456789012345678901234567890}",
	    "nul"};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = idem_fingerprint(out, "POST", "/v1/x", bad[i], strlen(bad[i]));

		if (rc != IDEM_EINVAL)
			fail_msg("accepted bad JSON %s", bad[i]);
		assert_int_equal(idem_error_last()->code, IDEM_EINVAL);
		assert_true(strlen(idem_error_last()->message) > 0);
	}
}

static void key_syntax(void **state)
{
	char k[300];

	(void)state;
	memset(k, 'a', sizeof(k));
	assert_int_equal(idem_key_validate(k, 255), 0);
	assert_int_equal(idem_key_validate(k, 256), IDEM_EINVAL);
	assert_int_equal(idem_key_validate(k, 0), IDEM_EINVAL);
	assert_int_equal(idem_key_validate("a b", 3), IDEM_EINVAL);
	assert_int_equal(idem_key_validate("a\nb", 3), IDEM_EINVAL);
	assert_int_equal(idem_key_validate("a\x7f", 2), IDEM_EINVAL);
	assert_int_equal(idem_key_validate("a\0b", 3), IDEM_EINVAL);
	assert_int_equal(idem_key_validate("caf\xc3\xa9", 5), IDEM_EINVAL);
	assert_int_equal(idem_key_validate("'; DROP TABLE x;--", 18), IDEM_EINVAL);
	assert_int_equal(idem_key_validate("';DROP/**/TABLE/**/x;--", 23), 0);
	assert_int_equal(idem_key_validate("!~", 2), 0);
}

static void natural_key_syntax(void **state)
{
	char k[70];

	(void)state;
	memset(k, 'Z', sizeof(k));
	assert_int_equal(idem_natural_key_validate("ORD-2026_10.01", 14), 0);
	assert_int_equal(idem_natural_key_validate(k, 64), 0);
	assert_int_equal(idem_natural_key_validate(k, 65), IDEM_EINVAL);
	assert_int_equal(idem_natural_key_validate("", 0), IDEM_EINVAL);
	assert_int_equal(idem_natural_key_validate("A B", 3), IDEM_EINVAL);
	assert_int_equal(idem_natural_key_validate("A'1", 3), IDEM_EINVAL);
	assert_int_equal(idem_natural_key_validate("A/1", 3), IDEM_EINVAL);
}

static void error_names(void **state)
{
	(void)state;
	assert_string_equal(idem_strerror(IDEM_EUNAVAIL), "store unavailable");
	assert_string_equal(idem_strerror(-999), "unknown error");
	assert_int_equal(idem_error_classify(IDEM_ERETRY), IDEM_ECLASS_RETRYABLE);
	assert_int_equal(idem_error_classify(IDEM_EUNAVAIL), IDEM_ECLASS_UNAVAILABLE);
	assert_string_equal(idem_error_class_name(IDEM_ECLASS_CONSTRAINT), "constraint");
	assert_string_equal(idem_outcome_name(IDEM_IN_PROGRESS), "in_progress");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(order_and_space_do_not_matter),
	    cmocka_unit_test(changes_that_matter),
	    cmocka_unit_test(parts_cannot_shift),
	    cmocka_unit_test(unicode_escapes_are_canonical),
	    cmocka_unit_test(bad_json_is_rejected),
	    cmocka_unit_test(key_syntax),
	    cmocka_unit_test(natural_key_syntax),
	    cmocka_unit_test(error_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
