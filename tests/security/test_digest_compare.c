/*
 * tests/security/test_digest_compare.c: API key digests are compared in
 * constant time (issue 13). Two proofs without timing anything:
 *  - pay__digest_equal compares all 64 bytes (a difference after a NUL, or
 *    in the last byte, is still a difference: no strcmp, no early exit
 *    on a terminator), and
 *  - idem_pay_authenticate reaches OpenSSL's CRYPTO_memcmp with 64 bytes on
 *    every path (store read, wrong key, cache hit): this program defines
 *    CRYPTO_memcmp itself, counting calls before forwarding to OpenSSL's, and
 *    the library's objects are linked into it, so their calls land here.
 * tests/security/test_constant_time.py checks that no plain compare is used
 * on digests, secrets or signatures anywhere in src/.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "pay/internal.h"
#include "support.h"

static int calls_64;
static int calls_other;

int CRYPTO_memcmp(const volatile void *a, const volatile void *b, size_t len);

int CRYPTO_memcmp(const volatile void *a, const volatile void *b, size_t len)
{
	static int (*real)(const volatile void *, const volatile void *, size_t);

	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "CRYPTO_memcmp");
	assert_non_null(real);
	if (len == 64)
		calls_64++;
	else
		calls_other++;
	return real(a, b, len);
}

static void test_helper_compares_every_byte(void **state)
{
	char a[65], b[65];

	(void)state;
	memset(a, 'a', 64);
	a[64] = '\0';
	memcpy(b, a, 65);
	assert_true(pay__digest_equal(a, b));
	for (int i = 0; i < 64; i++) {
		b[i] = 'b';
		assert_false(pay__digest_equal(a, b));
		b[i] = 'a';
	}
	/* Equal up to a NUL, different after it: a strcmp would say equal. */
	a[10] = b[10] = '\0';
	b[63] = 'z';
	assert_false(pay__digest_equal(a, b));
	b[63] = 'a';
	assert_true(pay__digest_equal(a, b));
	calls_64 = 0;
	assert_true(pay__digest_equal(a, b));
	assert_int_equal(calls_64, 1);
}

static void test_authenticate_uses_crypto_memcmp(void **state)
{
	char *url = test_db_url();
	idem_store *store = test_store_open(url, NULL);
	idem_pay *pay = NULL;
	char id[IDEM_PAY_ID_SIZE], key[IDEM_PAY_SECRET_SIZE], who[IDEM_PAY_ID_SIZE];
	size_t n;
	char orig;

	(void)state;
	assert_int_equal(idem_pay_open(&pay, store, NULL), 0);
	assert_int_equal(idem_pay_merchant_add(pay, "ct", id, key), 0);
	n = strlen(key);

	/* A wrong key with the right key id: read from the store, compared. */
	orig = key[n - 1];
	key[n - 1] = orig == '0' ? '1' : '0';
	calls_64 = 0;
	assert_int_equal(idem_pay_authenticate(pay, key, n, who), IDEM_ENOTFOUND);
	assert_true(calls_64 >= 1);
	key[n - 1] = orig;

	/* The right key, read from the store the first time. */
	calls_64 = 0;
	assert_int_equal(idem_pay_authenticate(pay, key, n, who), 0);
	assert_string_equal(who, id);
	assert_true(calls_64 >= 1);

	/* The cache hit compares in constant time too. */
	calls_64 = 0;
	assert_int_equal(idem_pay_authenticate(pay, key, n, who), 0);
	assert_true(calls_64 >= 1);
	assert_string_equal(who, id);

	idem_pay_close(pay);
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_helper_compares_every_byte),
	    cmocka_unit_test(test_authenticate_uses_crypto_memcmp),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
