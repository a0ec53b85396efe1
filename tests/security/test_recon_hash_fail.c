/*
 * tests/security/test_recon_hash_fail.c: a reconciliation row whose
 * fingerprint cannot be computed fails the import (issue 13). Before, the
 * failure was ignored and the row was claimed under an all-zero
 * fingerprint, which any other row with the same channel_txn_id would then
 * have matched. This program defines EVP_DigestFinal_ex itself (the
 * library's objects are linked into it, so their calls land here) and makes
 * it fail while `fail_hash` is set.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/admin.h"
#include "support.h"

static int fail_hash;

int EVP_DigestFinal_ex(EVP_MD_CTX *ctx, unsigned char *md, unsigned int *s)
{
	static int (*real)(EVP_MD_CTX *, unsigned char *, unsigned int *);

	if (fail_hash)
		return 0;
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "EVP_DigestFinal_ex");
	assert_non_null(real);
	return real(ctx, md, s);
}

static const char csv[] = IDEM_RECON_HEADER "\n"
                                            "T-1,m_1,O-1,100,CNY,SUCCESS,2026-10-01T10:00:00Z\n"
                                            "T-2,m_1,O-2,200,CNY,FAILED,2026-10-01T10:00:00Z\n";

static int import(idem_pay *pay, idem_recon_report *rep)
{
	FILE *in = fmemopen((void *)csv, sizeof(csv) - 1, "r");
	int rc;

	assert_non_null(in);
	memset(rep, 0, sizeof(*rep));
	rc = idem_recon_import(rep, pay, "wx", in, NULL);
	fclose(in);
	return rc;
}

static void test_hash_failure_fails_the_import(void **state)
{
	char *url = test_db_url();
	test_clock clock;
	idem_store *store = test_store_open(url, &clock);
	idem_pay *pay;
	char secret[IDEM_PAY_SECRET_SIZE];
	idem_recon_report rep;

	(void)state;
	assert_int_equal(idem_pay_open(&pay, store, NULL), 0);
	assert_int_equal(idem_pay_channel_add(pay, "wx", secret), 0);

	fail_hash = 1;
	assert_int_equal(import(pay, &rep), IDEM_ENOMEM);
	fail_hash = 0;
	assert_int_equal(rep.inserted, 0);

	/* Nothing was claimed under a bad fingerprint: the same file imports
	 * whole once hashing works. */
	assert_int_equal(import(pay, &rep), 0);
	assert_int_equal(rep.rows, 2);
	assert_int_equal(rep.inserted, 2);

	idem_pay_close(pay);
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_hash_failure_fails_the_import),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
