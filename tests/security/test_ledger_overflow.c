/*
 * tests/security/test_ledger_overflow.c: a credit that would take a balance
 * past INT64_MAX is refused with a stored 409 balance_overflow (a retry
 * replays it), on every backend, and nothing of the refused unit is kept:
 * the payment stays processing, no ledger entry, the balance still equals
 * its ledger sum. Before the fix SQLite turned the balance into a REAL that
 * no longer equalled the ledger, and PostgreSQL / MariaDB failed the
 * statement with a range error (answered 503 for ever).
 *
 * The balance is seeded near 2^63 with one ledger entry of that size, so the
 * invariant balance == SUM(ledger) holds from the start.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pay/internal.h"
#include "support.h"

#define MAX_AMOUNT 1000000000000000LL /* 10^15: the largest single amount */
#define NEAR_MAX   (INT64_MAX - MAX_AMOUNT / 2)

typedef struct {
	char *url;
	test_clock clock;
	idem_store *store;
	idem_pay *pay;
	char a[IDEM_PAY_ID_SIZE], b[IDEM_PAY_ID_SIZE];
} fixture;

typedef struct {
	const char *merchant;
	int64_t amount;
	const char *ref;
} seed_ctx;

static int seed_fn(idem_txn *txn, void *vctx)
{
	seed_ctx *s = vctx;
	idem_value e[4] = {IDEM_V_TEXT(s->merchant), IDEM_V_INT(s->amount), IDEM_V_TEXT(s->ref),
	                   IDEM_V_INT(1)};
	idem_value b[2] = {IDEM_V_TEXT(s->merchant), IDEM_V_INT(s->amount)};
	int rc;

	rc =
	    idem_txn_exec(txn,
	                  "INSERT INTO ledger_entries (merchant_id, currency, amount, kind, ref_id,"
	                  " created_at) VALUES (?, 'CNY', ?, 'seed', ?, ?)",
	                  e, 4, NULL);
	if (rc == 0)
		rc = idem_txn_exec(
		    txn,
		    "INSERT INTO balances (merchant_id, currency, amount) VALUES (?, 'CNY', ?)", b,
		    2, NULL);
	return rc;
}

static void seed(fixture *f, const char *merchant, int64_t amount)
{
	seed_ctx s = {merchant, amount, merchant};

	assert_int_equal(idem_store_transact(f->store, seed_fn, &s), 0);
}

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));
	char secret[IDEM_PAY_SECRET_SIZE], key[IDEM_PAY_SECRET_SIZE];

	assert_non_null(f);
	f->clock.now_ms = 1790000000000LL;
	f->url = test_db_url();
	f->store = test_store_open(f->url, &f->clock);
	assert_int_equal(idem_pay_open(&f->pay, f->store, NULL), 0);
	assert_int_equal(idem_pay_channel_add(f->pay, "wx", secret), 0);
	assert_int_equal(idem_pay_merchant_add(f->pay, "A", f->a, key), 0);
	assert_int_equal(idem_pay_merchant_add(f->pay, "B", f->b, key), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fixture *f = *state;

	idem_pay_close(f->pay);
	idem_store_close(f->store);
	test_db_drop(f->url);
	free(f->url);
	free(f);
	return 0;
}

/* ---- reading the database back ---- */

typedef struct {
	int64_t sum;
	int overflow;
	int rows;
} sum_ctx;

static int add_row(void *vctx, const idem_value *c, int n)
{
	sum_ctx *s = vctx;

	assert_int_equal(n, 1);
	assert_int_equal(c[0].type, IDEM_VAL_INT);
	if (__builtin_add_overflow(s->sum, c[0].i, &s->sum))
		s->overflow = 1;
	s->rows++;
	return 0;
}

typedef struct {
	int64_t v;
	idem_val_type type;
	int found;
} one_ctx;

static int one_row(void *vctx, const idem_value *c, int n)
{
	one_ctx *o = vctx;

	assert_int_equal(n, 1);
	o->type = c[0].type;
	o->v = c[0].i;
	o->found = 1;
	return 1;
}

/* The balance (must be stored as an integer) and its ledger sum agree. */
static int64_t checked_balance(fixture *f, const char *merchant)
{
	idem_value p[1] = {IDEM_V_TEXT(merchant)};
	sum_ctx s = {0, 0, 0};
	one_ctx b = {0, IDEM_VAL_NULL, 0};

	assert_int_equal(idem_store_query(f->store,
	                                  "SELECT amount FROM ledger_entries WHERE merchant_id = ?"
	                                  " AND currency = 'CNY'",
	                                  p, 1, add_row, &s),
	                 0);
	assert_int_equal(idem_store_query(f->store,
	                                  "SELECT amount FROM balances WHERE merchant_id = ?"
	                                  " AND currency = 'CNY'",
	                                  p, 1, one_row, &b),
	                 0);
	assert_false(s.overflow);
	if (!b.found)
		return 0;
	assert_int_equal(b.type, IDEM_VAL_INT); /* SQLite: not turned into a REAL */
	assert_true(b.v == s.sum);
	return b.v;
}

static void payment_status(fixture *f, const char *id, char out[32])
{
	idem_result r;
	json_t *doc;

	memset(&r, 0, sizeof(r));
	assert_int_equal(idem_pay_get_payment(&r, f->pay, f->a, id), 0);
	assert_int_equal(r.http_status, 200);
	doc = json_loadb((const char *)r.body, r.body_len, 0, NULL);
	assert_non_null(doc);
	snprintf(out, 32, "%s", json_string_value(json_object_get(doc, "status")));
	json_decref(doc);
	idem_result_clear(&r);
}

/* ---- requests ---- */

static void request(idem_result *r, int (*fn)(idem_result *, idem_pay *, const idem_pay_request *),
                    idem_pay *pay, const char *caller, const char *key, const char *path,
                    const char *body)
{
	idem_pay_request rq = {caller, key,  key ? strlen(key) : 0, 0, "POST",
	                       path,   body, strlen(body)};

	memset(r, 0, sizeof(*r));
	assert_int_equal(fn(r, pay, &rq), 0);
}

static void create_payment(fixture *f, const char *order, int64_t amount, char id[64])
{
	char body[256];
	idem_result r;
	json_t *doc;

	snprintf(body, sizeof(body),
	         "{\"merchant_order_no\":\"%s\",\"amount\":%lld,\"currency\":\"CNY\","
	         "\"channel\":\"wx\"}",
	         order, (long long)amount);
	request(&r, idem_pay_create_payment, f->pay, f->a, order, "/v1/payments", body);
	assert_int_equal(r.http_status, 201);
	doc = json_loadb((const char *)r.body, r.body_len, 0, NULL);
	assert_non_null(doc);
	snprintf(id, 64, "%s", json_string_value(json_object_get(doc, "id")));
	json_decref(doc);
	idem_result_clear(&r);
}

static void notify(idem_result *r, fixture *f, const char *notify_id, const char *payment,
                   int64_t amount)
{
	char body[320];

	snprintf(body, sizeof(body),
	         "{\"notify_id\":\"%s\",\"payment_id\":\"%s\",\"channel_txn_id\":\"T-%s\","
	         "\"status\":\"SUCCESS\",\"amount\":%lld}",
	         notify_id, payment, notify_id, (long long)amount);
	request(r, idem_pay_notify, f->pay, "wx", NULL, "/v1/notifications/wx", body);
}

static void assert_overflow_problem(const idem_result *r)
{
	json_t *doc = json_loadb((const char *)r->body, r->body_len, 0, NULL);

	assert_int_equal(r->http_status, 409);
	assert_non_null(doc);
	assert_string_equal(json_string_value(json_object_get(doc, "code")), "balance_overflow");
	json_decref(doc);
}

static void test_payment_credit_overflow_is_a_stored_409(void **state)
{
	fixture *f = *state;
	char id[64], status[32];
	idem_result first, again;

	seed(f, f->a, NEAR_MAX);
	create_payment(f, "O-big", MAX_AMOUNT, id);
	notify(&first, f, "N-1", id, MAX_AMOUNT);
	assert_int_equal(first.outcome, IDEM_FIRST);
	assert_overflow_problem(&first);
	assert_true(first.stored);
	/* The channel retries: the same answer, replayed. */
	notify(&again, f, "N-1", id, MAX_AMOUNT);
	assert_int_equal(again.outcome, IDEM_REPLAY);
	assert_int_equal(again.http_status, 409);
	assert_int_equal(again.body_len, first.body_len);
	assert_memory_equal(again.body, first.body, first.body_len);
	idem_result_clear(&first);
	idem_result_clear(&again);
	/* Nothing of the refused credit was kept. */
	payment_status(f, id, status);
	assert_string_equal(status, "processing");
	assert_true(checked_balance(f, f->a) == NEAR_MAX);

	/* A credit that fits still goes through, right up to the limit. */
	create_payment(f, "O-fits", MAX_AMOUNT / 2, id);
	notify(&first, f, "N-2", id, MAX_AMOUNT / 2);
	assert_int_equal(first.http_status, 200);
	idem_result_clear(&first);
	payment_status(f, id, status);
	assert_string_equal(status, "succeeded");
	assert_true(checked_balance(f, f->a) == INT64_MAX);

	/* At INT64_MAX even the smallest credit is refused. */
	create_payment(f, "O-one", 1, id);
	notify(&first, f, "N-3", id, 1);
	assert_overflow_problem(&first);
	idem_result_clear(&first);
	assert_true(checked_balance(f, f->a) == INT64_MAX);
}

static void test_transfer_credit_overflow_is_a_stored_409(void **state)
{
	fixture *f = *state;
	char body[256];
	idem_result first, again;

	seed(f, f->a, NEAR_MAX);
	seed(f, f->b, MAX_AMOUNT);
	snprintf(body, sizeof(body),
	         "{\"transfer_no\":\"TR-1\",\"to_merchant\":\"%s\",\"amount\":%lld,"
	         "\"currency\":\"CNY\"}",
	         f->a, (long long)MAX_AMOUNT);
	request(&first, idem_pay_transfer, f->pay, f->b, NULL, "/v1/transfers", body);
	assert_int_equal(first.outcome, IDEM_FIRST);
	assert_overflow_problem(&first);
	assert_true(first.stored);
	request(&again, idem_pay_transfer, f->pay, f->b, NULL, "/v1/transfers", body);
	assert_int_equal(again.outcome, IDEM_REPLAY);
	assert_int_equal(again.body_len, first.body_len);
	assert_memory_equal(again.body, first.body, first.body_len);
	idem_result_clear(&first);
	idem_result_clear(&again);
	/* Neither side moved. */
	assert_true(checked_balance(f, f->a) == NEAR_MAX);
	assert_true(checked_balance(f, f->b) == MAX_AMOUNT);

	/* Half of it fits. */
	snprintf(body, sizeof(body),
	         "{\"transfer_no\":\"TR-2\",\"to_merchant\":\"%s\",\"amount\":%lld,"
	         "\"currency\":\"CNY\"}",
	         f->a, (long long)(MAX_AMOUNT / 2));
	request(&first, idem_pay_transfer, f->pay, f->b, NULL, "/v1/transfers", body);
	assert_int_equal(first.http_status, 201);
	idem_result_clear(&first);
	assert_true(checked_balance(f, f->a) == INT64_MAX);
	assert_true(checked_balance(f, f->b) == MAX_AMOUNT / 2);
}

typedef struct {
	const char *merchant;
	int64_t amount;
	int fits;
} post_ctx;

static int post_fn(idem_txn *txn, void *vctx)
{
	post_ctx *p = vctx;
	int rc;

	if ((rc = pay__lock_merchant(txn, p->merchant, 0)) < 0 ||
	    (rc = pay__credit_fits(txn, p->merchant, "CNY", p->amount, &p->fits)) < 0)
		return rc;
	return pay__post(txn, p->merchant, "CNY", p->amount, "payment", "ref-direct", 1);
}

/* The ledger itself refuses an overflowing credit, for a unit that did not ask. */
static void test_post_refuses_an_overflowing_credit(void **state)
{
	fixture *f = *state;
	post_ctx p = {f->a, MAX_AMOUNT, 1};

	seed(f, f->a, NEAR_MAX);
	assert_int_equal(idem_store_transact(f->store, post_fn, &p), IDEM_ECONSTRAINT);
	assert_int_equal(p.fits, 0);
	assert_true(checked_balance(f, f->a) == NEAR_MAX);
	p.amount = MAX_AMOUNT / 2;
	assert_int_equal(idem_store_transact(f->store, post_fn, &p), 0);
	assert_int_equal(p.fits, 1);
	assert_true(checked_balance(f, f->a) == INT64_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_payment_credit_overflow_is_a_stored_409, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(test_transfer_credit_overflow_is_a_stored_409, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(test_post_refuses_an_overflowing_credit, setup,
	                                    teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
