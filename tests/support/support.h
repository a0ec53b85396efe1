/*
 * tests/support/support.h: what every test shares: a store on a throwaway
 * database with a clock the test moves by hand, unique scopes so tests never
 * see each other's records, and small helpers for the business table the
 * units of work write.
 */
#ifndef IDEM_TEST_SUPPORT_H
#define IDEM_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the three above first */
#include <cmocka.h>
#include <stdatomic.h>

#include "idem/idem.h"

typedef struct {
	_Atomic int64_t now_ms;
} test_clock;

int64_t test_clock_read(void *ctx);
void test_clock_advance(test_clock *c, int64_t ms);

/* A fresh, empty database URL for this test (sqlite temp file by default;
 * IDEM_TEST_URL overrides it for server backends). Caller frees. */
char *test_db_url(void);
/* Remove what test_db_url created (files of a sqlite URL). */
void test_db_drop(const char *url);

/* Open a store on url with a manual clock (NULL: real time). Fails the test on error. */
idem_store *test_store_open(const char *url, test_clock *clock);

/* A scope no other test uses: "t_<random>". Static per call site buffer; caller copies. */
void test_scope(char out[40]);

/* Create the work_log table the units write (idempotent). */
void test_create_work_log(idem_store *store);
/* Rows in work_log for (scope, key). */
int64_t test_work_count(idem_store *store, const char *scope, const char *key);

/* Fingerprint of a small JSON body for POST /v1/test. */
void test_fp(char out[65], const char *json);

#endif
