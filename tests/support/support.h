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

/*
 * A fresh, empty database URL for this test. Caller frees. By default a
 * SQLite temp file; IDEM_TEST_URL picks another store:
 *   sqlite:...                 used as is
 *   postgres | mariadb         a new database on the server whose admin URL
 *                              scripts/db-up.sh exported (IDEM_TEST_PG_URL,
 *                              IDEM_TEST_MARIADB_URL); without it the
 *                              program exits 77 (skipped) with a message
 *   postgresql://... mysql://...  a new database under this admin URL
 */
char *test_db_url(void);
/* Remove what test_db_url created (sqlite files, or the server database). */
void test_db_drop(const char *url);
/* The admin URL of a server backend ("postgres", "mariadb"), or skip() the
 * calling test with a visible message when that server is not running. */
const char *test_server_admin_url(const char *backend);

/* Open a store on url with a manual clock (NULL: real time). Fails the test
 * on error. IDEM_TEST_BATCH=N turns group commit on (batch_max N),
 * IDEM_TEST_CACHE=1 the front cache, so every suite also runs with them. */
idem_store *test_store_open(const char *url, test_clock *clock);

/* A scope no other test uses: "t_<random>". Static per call site buffer; caller copies. */
void test_scope(char out[40]);

/* Create the work_log table the units write (idempotent). */
void test_create_work_log(idem_store *store);
/* Rows in work_log for (scope, key). */
int64_t test_work_count(idem_store *store, const char *scope, const char *key);

/* Fingerprint of a small JSON body for POST /v1/test. */
void test_fp(char out[65], const char *json);

/*
 * The fixture of the server-backend suites (tests/store): a throwaway
 * database on backend's server ("postgres", "mariadb"), a store on it, a
 * scope and the work_log table. test_net_setup / test_net_teardown are
 * cmocka's setup and teardown; test_net_open is called in the test body,
 * where skip() works (it does not in a setup), and skips without the server.
 * with_store 0: only the database URL, no store.
 */
typedef struct {
	char *url;
	idem_store *store;
	char scope[40];
} test_net_fixture;

int test_net_setup(void **state);
int test_net_teardown(void **state);
test_net_fixture *test_net_open(void **state, const char *backend, int with_store);

/* A row callback: *(int64_t *)ctx = the first column when an integer, else -1. */
int test_first_int(void *ctx, const idem_value *cols, int n);

/* A row callback keeping a copy of up to 8 columns (text and blobs short). */
typedef struct {
	idem_value v[8];
	int n;
	unsigned char blob[8];
	char text[8][32];
} test_row;

int test_copy_row(void *ctx, const idem_value *cols, int n);

#endif
