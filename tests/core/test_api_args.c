/*
 * tests/core/test_api_args.c: every public call declared in include/idem
 * checks what its header states about its arguments (issue 10, libgit2's
 * GIT_ASSERT_ARG). A NULL handle, or a valid handle with a required pointer
 * NULL, is answered IDEM_EINVAL (or the answer the header documents) with
 * the argument named in idem_error_last(), never a crash; an async call
 * answers done exactly once, with IDEM_EINVAL and an empty result. Calls
 * documented to take NULL are called with it. idem_strerror,
 * idem_error_last, idem_error_classify, idem_error_class_name,
 * idem_outcome_name, idem_deadline_end, idem_deadline_get and
 * idem_deadline_adopt take no pointer. Not here yet: the calls of
 * src/pay/merchants.c and src/pay/pipeline.c (idem_pay_merchant_add,
 * idem_pay_merchant_count, idem_pay_authenticate) (merchants.c,
 * pipeline.c: next commit).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/admin.h"
#include "support.h"
#include "util/error.h"

typedef struct {
	idem_store *store;
	idem_pay *pay;
} fixture;

static int teardown(void **state)
{
	fixture *f = *state;

	idem_pay_close(f->pay);
	idem_store_close(f->store);
	free(f);
	return 0;
}

/* A store on a private in-memory database, and the payment domain on it. */
static int setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	*state = f;
	if (idem_store_open(&f->store, "sqlite::memory:", NULL) < 0 ||
	    idem_pay_open(&f->pay, f->store, NULL) < 0) {
		teardown(state);
		return -1;
	}
	return 0;
}

static int ident_char(char c)
{
	return isalnum((unsigned char)c) || c == '_';
}

/* Whether msg holds arg as a whole word ("out", not the "out" of "without"). */
static int names(const char *msg, const char *arg)
{
	size_t n = strlen(arg);

	for (const char *p = msg; (p = strstr(p, arg)) != NULL; p++)
		if ((p == msg || !ident_char(p[-1])) && !ident_char(p[n]))
			return 1;
	return 0;
}

/* The detail the last call left: IDEM_EINVAL naming arg. */
static void check_named(const char *arg, const char *call, int line)
{
	const idem_error *e = idem_error_last();

	if (e->code != IDEM_EINVAL || !names(e->message, arg))
		fail_msg("line %d: %s left code %d, '%s': expected IDEM_EINVAL naming '%s'", line,
		         call, e->code, e->message, arg);
}

static void check_einval(int rc, const char *arg, const char *call, int line)
{
	if (rc != IDEM_EINVAL)
		fail_msg("line %d: %s returned %d, not IDEM_EINVAL", line, call, rc);
	check_named(arg, call, line);
}

/* An int call answers IDEM_EINVAL naming arg (the detail cleared before it). */
#define FAILS(call, arg)                                                                           \
	do {                                                                                       \
		idem__error_clear();                                                               \
		check_einval((call), (arg), #call, __LINE__);                                      \
	} while (0)

/* A call answering something else: want is its documented answer. */
#define ANSWERS(call, want, arg)                                                                   \
	do {                                                                                       \
		idem__error_clear();                                                               \
		assert_true((call) == (want));                                                     \
		check_named((arg), #call, __LINE__);                                               \
	} while (0)

/* A void call: it returns, and leaves the detail naming arg. */
#define RETURNS(call, arg)                                                                         \
	do {                                                                                       \
		idem__error_clear();                                                               \
		call;                                                                              \
		check_named((arg), #call, __LINE__);                                               \
	} while (0)

static int never_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	(void)txn;
	++*(int *)ctx; /* counted: none of these calls may run it */
	return idem_response_set(resp, 200, "{}", 2);
}

static int noop_txn(idem_txn *txn, void *ctx)
{
	(void)txn;
	(void)ctx;
	return 0;
}

static void never_counter(void *ctx, const char *type, const uint64_t *counts)
{
	(void)type;
	(void)counts;
	++*(int *)ctx;
}

static int never_entry(void *ctx, const idem_admin_entry *e)
{
	(void)e;
	++*(int *)ctx;
	return 0;
}

/* What done saw: how often, with what, and whether the result was empty. */
typedef struct {
	int calls, rc, empty;
} answered;

static void on_done(void *ctx, int rc, idem_result *res)
{
	answered *a = ctx;

	a->calls++;
	a->rc = rc;
	a->empty = res && res->outcome == 0 && res->http_status == 0 && !res->body &&
	           res->body_len == 0 && !res->stored;
	idem_result_clear(res);
}

static void check_answered(const answered *a, const char *arg, const char *call, int line)
{
	if (a->calls != 1 || a->rc != IDEM_EINVAL || !a->empty)
		fail_msg("line %d: %s: done called %d times, last with %d (empty %d)", line, call,
		         a->calls, a->rc, a->empty);
	check_named(arg, call, line);
}

static void fill_request(idem_request *req, char fp[65])
{
	test_fp(fp, "{\"a\":1}");
	req->scope = "t_api_args";
	req->business_type = "test";
	req->key = "k1";
	req->key_len = 2;
	req->fingerprint = fp;
}

/* ---- idem/util.h ---------------------------------------------------------- */

static void util_calls(void **state)
{
	char fp[65];

	(void)state;
	/* Pure validators: NULL is one more invalid input (no detail is kept). */
	assert_int_equal(idem_key_validate(NULL, 3), IDEM_EINVAL);
	assert_int_equal(idem_natural_key_validate(NULL, 3), IDEM_EINVAL);
	assert_int_equal(idem_token_validate(NULL, 3, 10), IDEM_EINVAL);

	FAILS(idem_fingerprint(NULL, "POST", "/p", "{}", 2), "out");
	FAILS(idem_fingerprint(fp, NULL, "/p", "{}", 2), "method");
	FAILS(idem_fingerprint(fp, "POST", NULL, "{}", 2), "path");
	FAILS(idem_fingerprint(fp, "POST", "/p", NULL, 2), "body");
	assert_int_equal(idem_fingerprint(fp, "POST", "/p", NULL, 0), 0);
	FAILS(idem_fingerprint_canonical(NULL, "POST", "/p", "{}", 2), "out");
	FAILS(idem_fingerprint_canonical(fp, NULL, "/p", "{}", 2), "method");
	FAILS(idem_fingerprint_canonical(fp, "POST", NULL, "{}", 2), "path");
	FAILS(idem_fingerprint_canonical(fp, "POST", "/p", NULL, 2), "canon");
}

/* ---- idem/store.h --------------------------------------------------------- */

static int txn_calls(idem_txn *txn, void *ctx)
{
	idem_value one = IDEM_V_INT(1);
	int settled = 0, *ran = ctx;

	(*ran)++;
	FAILS(idem_txn_exec(txn, NULL, NULL, 0, NULL), "sql");
	FAILS(idem_txn_exec(txn, "SELECT ?", NULL, 1, NULL), "params");
	FAILS(idem_txn_try_exec(txn, NULL, NULL, 0, NULL), "sql");
	FAILS(idem_txn_try_exec(txn, "SELECT ?", NULL, 1, NULL), "params");
	FAILS(idem_txn_query(txn, NULL, NULL, 0, NULL, NULL), "sql");
	FAILS(idem_txn_query(txn, "SELECT ?", NULL, 1, NULL, NULL), "params");
	assert_int_equal(idem_txn_query(txn, "SELECT ?", &one, 1, NULL, NULL), 0);

	/* idem/claim.h's call made inside a transaction. */
	FAILS(idem_record_settle(txn, NULL, "test", "k", 1, 200, "{}", 2, &settled), "scope");
	FAILS(idem_record_settle(txn, "s", NULL, "k", 1, 200, "{}", 2, &settled), "business_type");
	FAILS(idem_record_settle(txn, "s", "test", NULL, 1, 200, "{}", 2, &settled), "key");
	FAILS(idem_record_settle(txn, "s", "test", "k", 1, 200, NULL, 2, &settled), "body");
	FAILS(idem_record_settle(txn, "s", "test", "k", 1, 200, "{}", 2, NULL), "settled");
	return 0;
}

static void store_calls(void **state)
{
	fixture *f = *state;
	idem_store *s = NULL;
	idem_value one = IDEM_V_INT(1);
	int64_t n = 7;
	int v = 0, ran = 0;

	FAILS(idem_store_open(NULL, "sqlite::memory:", NULL), "out");
	FAILS(idem_store_open(&s, NULL, NULL), "url");
	assert_null(s);
	idem_store_close(NULL); /* accepted */
	ANSWERS(strcmp(idem_store_backend(NULL), ""), 0, "store");
	FAILS(idem_store_migrate(NULL, NULL), "store");
	assert_int_equal(idem_store_migrate(f->store, NULL), 0); /* version_out: optional */
	FAILS(idem_store_schema_version(NULL, &v), "store");
	FAILS(idem_store_schema_version(f->store, NULL), "out");
	FAILS(idem_store_schema_latest(NULL), "store");
	FAILS(idem_store_ping(NULL), "store");
	idem_deadline_begin(NULL); /* accepted: no deadline */
	assert_int_equal(idem_deadline_get(), 0);
	idem_deadline_end();
	ANSWERS(idem_store_now(NULL), IDEM_EINVAL, "store");
	FAILS(idem_store_purge(NULL, 10, 0, NULL), "store");
	assert_int_equal(idem_store_purge(f->store, 10, 0, NULL), 0); /* deleted_out: optional */
	FAILS(idem_row_int(NULL, &one, 1), "ctx");
	FAILS(idem_row_int(&n, NULL, 1), "cols");
	assert_int_equal(idem_row_int(&n, NULL, 0), 1);
	assert_int_equal(n, 0);
	FAILS(idem_txn_exec(NULL, "SELECT 1", NULL, 0, NULL), "txn");
	FAILS(idem_txn_try_exec(NULL, "SELECT 1", NULL, 0, NULL), "txn");
	FAILS(idem_txn_query(NULL, "SELECT 1", NULL, 0, NULL, NULL), "txn");
	ANSWERS(idem_txn_store(NULL), NULL, "txn");
	FAILS(idem_store_query(NULL, "SELECT 1", NULL, 0, NULL, NULL), "store");
	FAILS(idem_store_query(f->store, NULL, NULL, 0, NULL, NULL), "sql");
	FAILS(idem_store_query(f->store, "SELECT ?", NULL, 1, NULL, NULL), "params");
	FAILS(idem_store_transact(NULL, noop_txn, NULL), "store");
	FAILS(idem_store_transact(f->store, NULL, NULL), "fn");
	assert_int_equal(idem_store_transact(f->store, txn_calls, &ran), 0);
	assert_int_equal(ran, 1);
}

/* ---- idem/claim.h --------------------------------------------------------- */

static void execute_calls(idem_store *store, const idem_request *req)
{
	idem_result res = {0};
	answered a = {0};
	int worked = 0;

	FAILS(idem_execute(NULL, store, req, never_work, &worked), "out");
	FAILS(idem_execute(&res, NULL, req, never_work, &worked), "store");
	FAILS(idem_execute(&res, store, NULL, never_work, &worked), "req");
	FAILS(idem_execute(&res, store, req, NULL, &worked), "work");
	idem_result_clear(&res);

	idem__error_clear();
	idem_execute_async(NULL, req, never_work, &worked, on_done, &a);
	check_answered(&a, "store", "idem_execute_async(NULL store)", __LINE__);
	a = (answered){0};
	idem__error_clear();
	idem_execute_async(store, NULL, never_work, &worked, on_done, &a);
	check_answered(&a, "req", "idem_execute_async(NULL req)", __LINE__);
	a = (answered){0};
	idem__error_clear();
	idem_execute_async(store, req, NULL, &worked, on_done, &a);
	check_answered(&a, "work", "idem_execute_async(NULL work)", __LINE__);
	idem_execute_async(NULL, NULL, NULL, NULL, NULL, NULL); /* nobody to answer */
	/* _nowait leaves every one of these to idem_execute_async: nothing done. */
	a = (answered){0};
	assert_int_equal(idem_execute_async_nowait(NULL, req, never_work, &worked, on_done, &a),
	                 IDEM_EWOULDBLOCK);
	assert_int_equal(idem_execute_async_nowait(store, NULL, never_work, &worked, on_done, &a),
	                 IDEM_EWOULDBLOCK);
	assert_int_equal(idem_execute_async_nowait(store, req, NULL, &worked, on_done, &a),
	                 IDEM_EWOULDBLOCK);
	assert_int_equal(idem_execute_async_nowait(store, req, never_work, &worked, NULL, NULL),
	                 IDEM_EWOULDBLOCK);
	assert_int_equal(a.calls, 0);
	assert_int_equal(worked, 0);
}

static void claim_calls(void **state)
{
	fixture *f = *state;
	idem_request req = IDEM_REQUEST_INIT;
	idem_response resp = {0, NULL, 0, 1};
	idem_record_info info = {0};
	idem_result res = {0};
	idem_claim *c = NULL;
	char fp[65];
	int worked = 0;

	fill_request(&req, fp);
	idem_result_clear(NULL);      /* accepted */
	idem_record_info_clear(NULL); /* accepted */
	idem_claim_free(NULL);        /* accepted */
	FAILS(idem_response_set(NULL, 200, "{}", 2), "resp");
	FAILS(idem_response_set(&resp, 200, NULL, 2), "body");
	assert_int_equal(idem_response_set(&resp, 204, NULL, 0), 0);
	free(resp.body);

	execute_calls(f->store, &req);

	FAILS(idem_claim_begin(NULL, &res, f->store, &req), "out_claim");
	FAILS(idem_claim_begin(&c, NULL, f->store, &req), "out");
	FAILS(idem_claim_begin(&c, &res, NULL, &req), "store");
	FAILS(idem_claim_begin(&c, &res, f->store, NULL), "req");
	FAILS(idem_claim_begin_with(NULL, &res, f->store, &req, NULL, NULL), "out_claim");
	FAILS(idem_claim_begin_with(&c, NULL, f->store, &req, NULL, NULL), "out");
	FAILS(idem_claim_begin_with(&c, &res, NULL, &req, NULL, NULL), "store");
	FAILS(idem_claim_begin_with(&c, &res, f->store, NULL, NULL, NULL), "req");
	assert_null(c);
	FAILS(idem_claim_complete(NULL, 200, "{}", 2), "claim");
	FAILS(idem_claim_finish(NULL, NULL, never_work, &worked), "out");
	FAILS(idem_claim_finish(&res, NULL, never_work, &worked), "claim");
	FAILS(idem_claim_extend(NULL, 1000), "claim");
	FAILS(idem_claim_abort(NULL), "claim");

	/* With a claim held: the required pointers beside it. */
	assert_int_equal(idem_claim_begin(&c, &res, f->store, &req), 0);
	assert_non_null(c);
	FAILS(idem_claim_finish(NULL, c, never_work, &worked), "out");
	FAILS(idem_claim_finish(&res, c, NULL, &worked), "work");
	FAILS(idem_claim_complete(c, 200, NULL, 2), "body");
	assert_int_equal(idem_claim_abort(c), 0);
	idem_claim_free(c);
	idem_result_clear(&res);
	assert_int_equal(worked, 0);

	FAILS(idem_record_settle(NULL, "s", "test", "k", 1, 200, "{}", 2, &worked), "txn");
	FAILS(idem_record_get(NULL, f->store, "s", "test", "k", 1), "out");
	FAILS(idem_record_get(&info, NULL, "s", "test", "k", 1), "store");
	FAILS(idem_record_get(&info, f->store, NULL, "test", "k", 1), "scope");
	FAILS(idem_record_get(&info, f->store, "s", NULL, "k", 1), "business_type");
	FAILS(idem_record_get(&info, f->store, "s", "test", NULL, 1), "key");
	idem_record_info_clear(&info);
}

/* ---- idem/metrics.h ------------------------------------------------------- */

static void metrics_calls(void **state)
{
	fixture *f = *state;
	idem_cache_stats st;
	int called = 0;

	RETURNS(idem_metrics_each(NULL, never_counter, &called), "store");
	RETURNS(idem_metrics_each(f->store, NULL, &called), "fn");
	assert_int_equal(called, 0);
	ANSWERS(idem_metrics_store_errors(NULL, IDEM_ECLASS_OTHER), 0, "store");
	memset(&st, 0xff, sizeof(st));
	RETURNS(idem_metrics_cache(NULL, &st), "store");
	assert_true(st.hits == 0 && st.misses == 0 && st.evictions == 0 && st.entries == 0 &&
	            st.bytes == 0);
	RETURNS(idem_metrics_cache(f->store, NULL), "out");
	ANSWERS(idem_metrics_purged(NULL), 0, "store");
}

/* ---- idem/pay.h ----------------------------------------------------------- */

typedef int (*sync_fn)(idem_result *, idem_pay *, const idem_pay_request *);
typedef void (*async_fn)(idem_pay *, const idem_pay_request *, idem_done_fn, void *);

static const struct {
	const char *name;
	sync_fn sync;
	async_fn async;
} writes[] = {
    {"payment", idem_pay_create_payment, idem_pay_create_payment_async},
    {"notify", idem_pay_notify, idem_pay_notify_async},
    {"refund", idem_pay_refund, idem_pay_refund_async},
    {"transfer", idem_pay_transfer, idem_pay_transfer_async},
};

static void write_calls(idem_pay *pay)
{
	idem_pay_request rq = {"m_x", "k1", 2, 0, "POST", "/v1/payments", "{}", 2};
	idem_result res = {0};

	for (size_t i = 0; i < sizeof(writes) / sizeof(writes[0]); i++) {
		answered a = {0};

		FAILS(writes[i].sync(NULL, pay, &rq), "out");
		FAILS(writes[i].sync(&res, NULL, &rq), "pay");
		FAILS(writes[i].sync(&res, pay, NULL), "rq");
		idem_result_clear(&res);

		idem__error_clear();
		writes[i].async(NULL, &rq, on_done, &a);
		check_answered(&a, "pay", writes[i].name, __LINE__);
		a = (answered){0};
		idem__error_clear();
		writes[i].async(pay, NULL, on_done, &a);
		check_answered(&a, "rq", writes[i].name, __LINE__);
		RETURNS(writes[i].async(pay, &rq, NULL, NULL), "done");
		RETURNS(writes[i].async(NULL, NULL, NULL, NULL), "pay");
	}
	{ /* the payment's _nowait form answers them as its _async form does */
		answered a = {0};

		idem__error_clear();
		assert_int_equal(idem_pay_create_payment_nowait(NULL, &rq, on_done, &a), 0);
		check_answered(&a, "pay", "idem_pay_create_payment_nowait", __LINE__);
		a = (answered){0};
		idem__error_clear();
		assert_int_equal(idem_pay_create_payment_nowait(pay, NULL, on_done, &a), 0);
		check_answered(&a, "rq", "idem_pay_create_payment_nowait", __LINE__);
		assert_int_equal(idem_pay_create_payment_nowait(pay, &rq, NULL, NULL), 0);
	}
}

static void read_calls(idem_pay *pay)
{
	idem_result res = {0};

	FAILS(idem_pay_get_payment(NULL, pay, "m", "pay_1"), "out");
	FAILS(idem_pay_get_payment(&res, NULL, "m", "pay_1"), "pay");
	FAILS(idem_pay_get_payment(&res, pay, NULL, "pay_1"), "merchant");
	FAILS(idem_pay_get_payment(&res, pay, "m", NULL), "id");
	FAILS(idem_pay_find_payment(NULL, pay, "m", "o1"), "out");
	FAILS(idem_pay_find_payment(&res, NULL, "m", "o1"), "pay");
	FAILS(idem_pay_find_payment(&res, pay, NULL, "o1"), "merchant");
	FAILS(idem_pay_find_payment(&res, pay, "m", NULL), "merchant_order_no");
	FAILS(idem_pay_get_balance(NULL, pay, "m"), "out");
	FAILS(idem_pay_get_balance(&res, NULL, "m"), "pay");
	FAILS(idem_pay_get_balance(&res, pay, NULL), "merchant");
	FAILS(idem_pay_get_record(NULL, pay, "m", "payment", "k", 1), "out");
	FAILS(idem_pay_get_record(&res, NULL, "m", "payment", "k", 1), "pay");
	FAILS(idem_pay_get_record(&res, pay, NULL, "payment", "k", 1), "merchant");
	FAILS(idem_pay_get_record(&res, pay, "m", NULL, "k", 1), "business_type");
	FAILS(idem_pay_get_record(&res, pay, "m", "payment", NULL, 1), "key");
	idem_result_clear(&res);
}

static void pay_handle_calls(void **state)
{
	fixture *f = *state;
	idem_store *stores[1] = {f->store};
	idem_pay *p = NULL;
	char *text = NULL;
	size_t len = 0;
	int shard = 0, n = 0;

	FAILS(idem_pay_open(NULL, f->store, NULL), "out");
	FAILS(idem_pay_open(&p, NULL, NULL), "store");
	FAILS(idem_pay_open_shards(NULL, stores, 1, NULL), "out");
	FAILS(idem_pay_open_shards(&p, NULL, 1, NULL), "stores");
	assert_null(p);
	idem_pay_close(NULL); /* accepted */
	{
		char id[IDEM_PAY_ID_SIZE], key[IDEM_PAY_SECRET_SIZE];
		int64_t count = 0;

		FAILS(idem_pay_merchant_add(NULL, "shop", id, key), "pay");
		FAILS(idem_pay_merchant_add(f->pay, "shop", NULL, key), "id_out");
		FAILS(idem_pay_merchant_add(f->pay, "shop", id, NULL), "key_out");
		FAILS(idem_pay_merchant_count(NULL, &count), "pay");
		FAILS(idem_pay_merchant_count(f->pay, NULL), "out");
		FAILS(idem_pay_authenticate(NULL, "sk_x", 4, id), "pay");
		FAILS(idem_pay_authenticate(f->pay, "sk_x", 4, NULL), "id_out");
		FAILS(idem_pay_authenticate_cached(NULL, "sk_x", 4, id), "pay");
		FAILS(idem_pay_authenticate_cached(f->pay, "sk_x", 4, NULL), "id_out");
		/* A NULL key is a malformed one, as the header says: no lookup finds it. */
		assert_int_equal(idem_pay_authenticate(f->pay, NULL, 0, id), IDEM_ENOTFOUND);
		assert_int_equal(idem_pay_authenticate_cached(f->pay, NULL, 0, id), IDEM_ENOTFOUND);
	}
	{
		idem_pay_request rq = {"m_x", "k1", 2, 0, "POST", "/v1/payments", "{}", 2};
		idem_result res = {0};

		FAILS(idem_pay_try_replay(NULL, f->pay, &rq), "out");
		FAILS(idem_pay_try_replay(&res, NULL, &rq), "pay");
		FAILS(idem_pay_try_replay(&res, f->pay, NULL), "rq");
		assert_int_equal(idem_pay_try_replay(&res, f->pay, &rq),
		                 0); /* no hit: not answered */
		idem_result_clear(&res);
	}
	FAILS(idem_pay_shard_of(NULL, 2), "merchant_id");
	FAILS(idem_pay_shard_count(NULL), "pay");
	FAILS(idem_pay_merchant_shard(NULL, "m", &shard), "pay");
	FAILS(idem_pay_merchant_shard(f->pay, NULL, &shard), "merchant_id");
	FAILS(idem_pay_merchant_shard(f->pay, "m", NULL), "shard");
	ANSWERS(idem_pay_shard(NULL, 0), NULL, "pay");
	FAILS(idem_pay_transfers_drive(NULL, &n), "pay");
	assert_int_equal(idem_pay_transfers_drive(f->pay, NULL), 0); /* settled: optional */
	FAILS(idem_pay_transfer_driver_start(NULL, 100, 0), "pay");
	FAILS(idem_pay_sweep(NULL, 0, &n, &n), "pay");
	assert_int_equal(idem_pay_sweep(f->pay, 0, NULL, NULL), 0); /* ran, resolved: optional */
	FAILS(idem_pay_sweeper_start(NULL, 100, 0), "pay");
	FAILS(idem_pay_metrics_text(NULL, &text, &len), "pay");
	FAILS(idem_pay_metrics_text(f->pay, NULL, &len), "out");
	FAILS(idem_pay_metrics_text(f->pay, &text, NULL), "len");
	FAILS(idem_pay_problem(NULL, &len, 400, "invalid_request", NULL, NULL, NULL), "out");
	FAILS(idem_pay_problem(&text, NULL, 400, "invalid_request", NULL, NULL, NULL), "len");
	FAILS(idem_pay_problem(&text, &len, 400, NULL, NULL, NULL, NULL), "code");
	assert_null(text);
}

static void pay_channel_calls(void **state)
{
	fixture *f = *state;
	char secret[IDEM_PAY_SECRET_SIZE], sig[65];
	unsigned char key[32] = {0};

	memset(sig, 'a', 64);
	sig[64] = '\0';
	FAILS(idem_pay_channel_add(NULL, "chan", secret), "pay");
	FAILS(idem_pay_channel_add(f->pay, NULL, secret), "name");
	FAILS(idem_pay_channel_add(f->pay, "chan", NULL), "secret_out");
	FAILS(idem_pay_channel_connect(NULL, "chan", NULL, 1000), "pay");
	FAILS(idem_pay_channel_connect(f->pay, NULL, NULL, 1000), "name");
	FAILS(idem_pay_set_secret_key(NULL, key), "pay");
	assert_int_equal(idem_pay_set_secret_key(f->pay, NULL), 0); /* NULL: no key */
	FAILS(idem_pay_secret_key_read(NULL, key), "path");
	FAILS(idem_pay_secret_key_read("/nonexistent/key", NULL), "key");
	FAILS(idem_pay_verify_signature(NULL, "chan", sig, 64, "{}", 2), "pay");
	FAILS(idem_pay_verify_signature(f->pay, "chan", sig, 64, NULL, 2), "body");
	/* No signature is a wrong signature, as documented. */
	assert_int_equal(idem_pay_verify_signature(f->pay, "chan", NULL, 0, "{}", 2),
	                 IDEM_ENOTFOUND);
	write_calls(f->pay);
	read_calls(f->pay);
}

/* ---- idem/admin.h, idem/recon.h, idem/stats.h ----------------------------- */

static void admin_calls(void **state)
{
	fixture *f = *state;
	char out[IDEM_PAY_SECRET_SIZE];
	int64_t n = 0;
	int called = 0;

	FAILS(idem_admin_merchant_list(NULL, never_entry, &called), "pay");
	FAILS(idem_admin_merchant_list(f->pay, NULL, &called), "fn");
	FAILS(idem_admin_channel_list(NULL, never_entry, &called), "pay");
	FAILS(idem_admin_channel_list(f->pay, NULL, &called), "fn");
	assert_int_equal(called, 0);
	FAILS(idem_admin_merchant_rotate_key(NULL, "m_x", out), "pay");
	FAILS(idem_admin_merchant_rotate_key(f->pay, NULL, out), "merchant_id");
	FAILS(idem_admin_merchant_rotate_key(f->pay, "m_x", NULL), "key_out");
	FAILS(idem_admin_channel_rotate_secret(NULL, "chan", out), "pay");
	FAILS(idem_admin_channel_rotate_secret(f->pay, NULL, out), "channel");
	FAILS(idem_admin_channel_rotate_secret(f->pay, "chan", NULL), "secret_out");
	FAILS(idem_admin_channel_rekey(NULL, NULL, &n), "pay");
	FAILS(idem_admin_purge_count(NULL, &n), "store");
	FAILS(idem_admin_purge_count(f->store, NULL), "out");
}

static void recon_stats_calls(void **state)
{
	fixture *f = *state;
	idem_recon_report rep;
	idem_stats_report sr;
	idem_stats_flusher *fl = NULL;
	FILE *csv = tmpfile();

	assert_non_null(csv);
	FAILS(idem_recon_import(NULL, f->pay, "chan", csv, NULL), "out");
	FAILS(idem_recon_import(&rep, NULL, "chan", csv, NULL), "pay");
	FAILS(idem_recon_import(&rep, f->pay, NULL, csv, NULL), "channel");
	FAILS(idem_recon_import(&rep, f->pay, "chan", NULL, NULL), "f");
	fclose(csv);

	FAILS(idem_stats_flusher_start(NULL, f->store, NULL), "out");
	FAILS(idem_stats_flusher_start(&fl, NULL, NULL), "store");
	assert_null(fl);
	ANSWERS(strcmp(idem_stats_flusher_instance(NULL), ""), 0, "f");
	FAILS(idem_stats_flusher_flush(NULL), "f");
	idem_stats_flusher_stop(NULL); /* accepted */
	FAILS(idem_stats_read(NULL, f->store, 1000), "out");
	FAILS(idem_stats_read(&sr, NULL, 1000), "store");
	idem_stats_report_clear(&sr);
	idem_stats_report_clear(NULL); /* accepted */
	FAILS(idem_stats_prune(NULL, 1000, NULL), "store");
	assert_int_equal(idem_stats_prune(f->store, 1000, NULL), 0); /* deleted_out: optional */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(util_calls),       cmocka_unit_test(store_calls),
	    cmocka_unit_test(claim_calls),      cmocka_unit_test(metrics_calls),
	    cmocka_unit_test(pay_handle_calls), cmocka_unit_test(pay_channel_calls),
	    cmocka_unit_test(admin_calls),      cmocka_unit_test(recon_stats_calls),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
