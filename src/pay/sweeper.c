/*
 * pay/sweeper.c: resolves what no client comes back for (CHANNEL.md). A
 * payment left 'creating' (its create call had no definite answer, or the
 * instance making it died) is queried at the channel: an order found gives
 * the payment the channel's status; an order the channel does not have is
 * closed there first, so a create still in flight can never be paid, and
 * only then is the payment failed. A record left PROCESSING by a dead owner
 * is completed with the resolved answer, so the client's retry replays it.
 * One instance sweeps at a time: a lease row in sweeper_lease.
 */
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pay/channel.h"
#include "pay/payment.h"
#include "util/error.h"
#include "util/rand.h"

#define SWEEP_BATCH 100
/* Short, and renewed before each payment: a dead holder blocks sweeping for
 * at most this long. A call slower than it may let a second instance in;
 * every step is idempotent at the channel and conditional here, so that
 * costs a repeated query, never a second effect. */
#define LEASE_MS   10000
#define LEASE_NAME "channels"

struct pay__sweeper {
	pay__ticker *ticker;
	idem_pay *pay;
	int64_t age_ms;
};

/* ---- the lease -------------------------------------------------------- */

typedef struct {
	const char *holder;
	int64_t now, until;
	int held;
} lease;

static int lease_step(idem_txn *txn, void *ctx)
{
	lease *l = ctx;
	idem_value v[4] = {IDEM_V_TEXT(l->holder), IDEM_V_INT(l->until), IDEM_V_INT(l->now),
	                   IDEM_V_TEXT(l->holder)};
	int64_t n = 0;
	int rc;

	l->held = 0;
	rc = idem_txn_exec(
	    txn,
	    "UPDATE sweeper_lease SET holder = ?, lease_until = ? WHERE name = '" LEASE_NAME
	    "' AND (lease_until <= ? OR holder = ?)",
	    v, 4, &n);
	if (rc < 0)
		return rc;
	if (n == 1) {
		l->held = 1;
		return 0;
	}
	{
		idem_value w[2] = {IDEM_V_TEXT(l->holder), IDEM_V_INT(l->until)};

		rc = idem_txn_try_exec(txn,
		                       "INSERT INTO sweeper_lease (name, holder, lease_until)"
		                       " VALUES ('" LEASE_NAME "', ?, ?)",
		                       w, 2, NULL);
	}
	if (rc == IDEM_ECONFLICT)
		return 0; /* another instance holds it */
	if (rc == 0)
		l->held = 1;
	return rc;
}

static int release_step(idem_txn *txn, void *ctx)
{
	lease *l = ctx;
	idem_value v[2] = {IDEM_V_INT(l->now), IDEM_V_TEXT(l->holder)};

	return idem_txn_exec(txn,
	                     "UPDATE sweeper_lease SET lease_until = ? WHERE name = '" LEASE_NAME
	                     "' AND holder = ?",
	                     v, 2, NULL);
}

/* ---- candidates --------------------------------------------------------- */

/* A payment or refund to resolve; refunds also carry their payment and status. */
typedef struct {
	char id[IDEM_PAY_ID_SIZE];
	char merchant[IDEM_PAY_ID_SIZE];
	char channel[IDEM_PAY_CHANNEL_MAX + 1];
	char key[IDEM_KEY_MAX + 1];
	int64_t updated_at, amount;
	char payment_id[IDEM_PAY_ID_SIZE];
	char status[16];
} cand;

typedef struct {
	cand *c;
	int n;
} cands;

/* Columns id, merchant_id, channel, idem_key, updated_at, amount
 * [, payment_id, status]. */
static int read_cand(void *ctx, const idem_value *col, int n)
{
	cands *l = ctx;
	cand *c;

	if (n != 6 && n != 8)
		return idem__error(IDEM_ESTORE, "sweeper row has %d columns", n);
	if (l->n >= SWEEP_BATCH)
		return 0;
	c = &l->c[l->n++];
	pay__col_text(c->id, sizeof(c->id), &col[0]);
	pay__col_text(c->merchant, sizeof(c->merchant), &col[1]);
	pay__col_text(c->channel, sizeof(c->channel), &col[2]);
	pay__col_text(c->key, sizeof(c->key), &col[3]);
	c->updated_at = col[4].i;
	c->amount = col[5].i;
	if (n == 8) {
		pay__col_text(c->payment_id, sizeof(c->payment_id), &col[6]);
		pay__col_text(c->status, sizeof(c->status), &col[7]);
	}
	return 0;
}

/* ---- resolving one payment ---------------------------------------------- */

typedef struct {
	idem_pay *pay;
	const cand *c;
	const char *status; /* the channel's order status; NULL: closed by us */
	const char *txn_id;
	const char *outcome; /* for the counters */
} resolve;

static int settle_record(idem_txn *txn, resolve *r)
{
	idem_response resp = {0, NULL, 0, 1};
	int rc, settled = 0;

	if (!r->c->key[0])
		return 0;
	if (!r->status)
		rc = pay__declined_problem(&resp, "ORDER_CLOSED");
	else if ((rc = pay__payment_answer(r->pay, txn, r->c->merchant, r->c->id, 201, &resp)) ==
	         IDEM_ENOTFOUND)
		rc = 1; /* nothing to settle */
	if (rc == 0)
		rc =
		    idem_record_settle(txn, r->c->merchant, "payment", r->c->key, strlen(r->c->key),
		                       resp.http_status, resp.body, resp.body_len, &settled);
	if (rc == 0 && settled && !r->outcome)
		r->outcome = "settled";
	free(resp.body);
	return rc < 0 ? rc : 0;
}

static int resolve_step(idem_txn *txn, void *ctx)
{
	resolve *r = ctx;
	int changed = 0, rc;

	if (r->status)
		rc = pay__apply_order_status(r->pay, txn, r->c->id, r->status, r->txn_id, &changed);
	else {
		pay__payment p = {0};

		rc = pay__fail_payment(txn, r->c->id, "ORDER_CLOSED", pay__now(r->pay));
		if (rc == 0 &&
		    (rc = pay__payment_load(r->pay, txn, &p, r->c->merchant, r->c->id)) == 0)
			changed = p.found && strcmp(p.status, "failed") == 0;
		pay__payment_clear(&p);
	}
	if (rc < 0)
		return rc;
	if (!changed && r->outcome && strcmp(r->outcome, "settled") != 0)
		r->outcome = NULL; /* resolved meanwhile by someone else */
	return settle_record(txn, r);
}

static const char *order_outcome(const char *status)
{
	if (strcmp(status, "SUCCESS") == 0)
		return "paid";
	if (strcmp(status, "PENDING") == 0)
		return "pending";
	return "failed";
}

static int valid_status(const char *s)
{
	return s && (strcmp(s, "PENDING") == 0 || strcmp(s, "SUCCESS") == 0 ||
	             strcmp(s, "FAILED") == 0 || strcmp(s, "CLOSED") == 0);
}

/* Query, and close what the channel does not have. 1 when resolved. */
static int sweep_one(idem_pay *pay, CURL *h, const cand *c, int64_t now)
{
	pay__chan ch;
	pay__ch_reply q = {0}, cl = {0};
	char path[128];
	resolve r = {pay, c, NULL, NULL, NULL};
	int found = 0, rc = 0;

	if (pay__chan_get(pay, c->channel, &ch, &found) < 0 || !found || !ch.base_url[0])
		goto done; /* no longer connected: nothing to ask */
	snprintf(path, sizeof(path), "/orders/%s", c->id);
	pay__ch_call(pay, h, &ch, PAY__CALL_QUERY, "GET", path, NULL, &q);
	if (q.outcome == PAY__CH_OK) {
		const char *no = json_string_value(json_object_get(q.doc, "out_trade_no"));
		const char *st = json_string_value(json_object_get(q.doc, "status"));

		json_t *amount = json_object_get(q.doc, "amount");

		if (!no || strcmp(no, c->id) != 0 || !valid_status(st))
			goto done;
		/* An order of another amount is not this payment's: never credit it
		 * (as a notification would be refused 422); reconciliation's case. */
		if (amount && (!json_is_integer(amount) || json_integer_value(amount) != c->amount))
			goto done;
		r.status = st;
		r.txn_id = json_string_value(json_object_get(q.doc, "channel_txn_id"));
		r.outcome = order_outcome(st);
	} else if (q.outcome == PAY__CH_DECLINED && strcmp(q.code, "ORDER_NOT_EXIST") == 0 &&
	           now - c->updated_at > ch.timeout_ms) {
		/* Close first: a create still on its way can then never be paid. */
		snprintf(path, sizeof(path), "/orders/%s/close", c->id);
		pay__ch_call(pay, h, &ch, PAY__CALL_CLOSE, "POST", path, "{}", &cl);
		if (cl.outcome != PAY__CH_OK)
			goto done; /* ORDER_PAID, or no answer: query again next pass */
		r.outcome = "closed";
	} else {
		goto done;
	}
	rc = idem_store_transact(pay->store, resolve_step, &r);
	if (rc == 0 && r.outcome) {
		pay__sweep_count(pay, r.outcome);
		rc = 1;
	}
done:
	pay__ch_reply_clear(&q);
	pay__ch_reply_clear(&cl);
	OPENSSL_cleanse(&ch, sizeof(ch));
	return rc < 0 ? 0 : rc;
}

static int settle_only(idem_txn *txn, void *ctx)
{
	return settle_record(txn, ctx);
}

/* Records left PROCESSING whose payment was resolved (by a notification). */
static int settle_orphans(idem_pay *pay, int64_t now, int *resolved)
{
	cand *buf = calloc(SWEEP_BATCH, sizeof(cand));
	cands l = {buf, 0};
	idem_value v[1] = {IDEM_V_INT(now)};
	int rc;

	if (!buf)
		return idem__error(IDEM_ENOMEM, "out of memory");
	rc = idem_store_query(
	    pay->store,
	    "SELECT p.id, p.merchant_id, p.channel, p.idem_key, p.updated_at, p.amount"
	    " FROM payments p JOIN idem_records r ON r.scope = p.merchant_id"
	    " AND r.business_type = 'payment' AND r.idem_key = p.idem_key"
	    " WHERE r.status = 'PROCESSING' AND r.lease_until <= ?"
	    " AND p.status <> 'creating' LIMIT 100",
	    v, 1, read_cand, &l);
	for (int i = 0; rc == 0 && i < l.n; i++) {
		resolve r = {pay, &l.c[i], "", NULL, NULL};

		/* status "" is never applied: settle_record only. */
		if (idem_store_transact(pay->store, settle_only, &r) == 0 && r.outcome) {
			pay__sweep_count(pay, r.outcome);
			(*resolved)++;
		}
	}
	free(buf);
	return rc;
}

/* ---- refunds ------------------------------------------------------------ */

typedef struct {
	idem_pay *pay;
	const cand *c;
	const char *status; /* SUCCESS, PROCESSING, FAILED */
	const char *channel_refund_id;
	const char *declined; /* the channel's code when it refused */
	int done;
} rresolve;

static int rresolve_step(idem_txn *txn, void *ctx)
{
	rresolve *r = ctx;
	idem_response resp = {0, NULL, 0, 1};
	int changed = 0, settled = 0, rc;

	r->done = 0;
	if ((rc = pay__refund_apply_status(r->pay, txn, r->c->merchant, r->c->id, r->status,
	                                   r->channel_refund_id, &changed)) < 0 ||
	    (r->declined && changed && (rc = pay__refund_set_code(txn, r->c->id, r->declined)) < 0))
		return rc;
	if (r->c->key[0]) {
		rc = r->declined ? pay__declined_problem(&resp, r->declined)
		                 : pay__refund_answer(txn, r->c->merchant, r->c->id, &resp);
		if (rc == 0)
			rc = idem_record_settle(txn, r->c->merchant, "refund", r->c->key,
			                        strlen(r->c->key), resp.http_status, resp.body,
			                        resp.body_len, &settled);
		free(resp.body);
	}
	r->done = rc == 0 && (changed || settled);
	return rc;
}

static int refund_reply_valid(const pay__ch_reply *q, const char *id)
{
	const char *no = json_string_value(json_object_get(q->doc, "out_refund_no"));
	const char *st = json_string_value(json_object_get(q->doc, "status"));

	return no && st && strcmp(no, id) == 0 &&
	       (strcmp(st, "SUCCESS") == 0 || strcmp(st, "PROCESSING") == 0 ||
	        strcmp(st, "FAILED") == 0);
}

/* Query; a refund the channel does not have is sent again (same number). */
static int sweep_refund(idem_pay *pay, CURL *h, const cand *c)
{
	pay__chan ch;
	pay__ch_reply q = {0};
	char path[128], *body = NULL;
	rresolve r = {pay, c, NULL, NULL, NULL, 0};
	int found = 0, rc = 0;

	if (pay__chan_get(pay, c->channel, &ch, &found) < 0 || !found || !ch.base_url[0])
		goto done;
	snprintf(path, sizeof(path), "/refunds/%s", c->id);
	pay__ch_call(pay, h, &ch, PAY__CALL_REFUND_QUERY, "GET", path, NULL, &q);
	if (q.outcome == PAY__CH_DECLINED && strcmp(q.code, "REFUND_NOT_EXIST") == 0 &&
	    strcmp(c->status, "creating") == 0) {
		pay__ch_reply_clear(&q);
		if (!(body = pay__refund_body(c->id, c->payment_id, c->amount)))
			goto done;
		pay__ch_call(pay, h, &ch, PAY__CALL_REFUND, "POST", "/refunds", body, &q);
		if (q.outcome == PAY__CH_DECLINED) {
			r.status = "FAILED";
			r.declined = q.code;
		}
	}
	if (q.outcome == PAY__CH_OK) {
		if (!refund_reply_valid(&q, c->id))
			goto done;
		r.status = json_string_value(json_object_get(q.doc, "status"));
		r.channel_refund_id =
		    json_string_value(json_object_get(q.doc, "channel_refund_id"));
	}
	if (!r.status ||
	    (strcmp(r.status, "PROCESSING") == 0 && strcmp(c->status, "processing") == 0))
		goto done; /* no answer, or still processing: next pass */
	rc = idem_store_transact(pay->store, rresolve_step, &r);
	if (rc == 0 && r.done) {
		pay__sweep_count(pay, "refund_done");
		rc = 1;
	}
done:
	free(body);
	pay__ch_reply_clear(&q);
	OPENSSL_cleanse(&ch, sizeof(ch));
	return rc < 0 ? 0 : rc;
}

static int sweep_refunds(idem_pay *pay, CURL *h, int64_t now, int64_t age_ms, int *resolved)
{
	cand *buf = calloc(SWEEP_BATCH, sizeof(cand));
	cands l = {buf, 0};
	idem_value v[2] = {IDEM_V_INT(now - age_ms), IDEM_V_INT(now)};
	int rc;

	if (!buf)
		return idem__error(IDEM_ENOMEM, "out of memory");
	rc = idem_store_query(
	    pay->store,
	    "SELECT r.id, r.merchant_id, p.channel, r.idem_key, r.updated_at, r.amount,"
	    " r.payment_id, r.status FROM refunds r JOIN payments p"
	    " ON p.id = r.payment_id"
	    " WHERE r.status IN ('creating', 'processing') AND r.updated_at <= ?"
	    " AND NOT EXISTS (SELECT 1 FROM idem_records i"
	    " WHERE i.scope = r.merchant_id AND i.business_type = 'refund'"
	    " AND i.idem_key = r.idem_key AND i.status = 'PROCESSING'"
	    " AND i.lease_until > ?) ORDER BY r.updated_at LIMIT 100",
	    v, 2, read_cand, &l);
	for (int i = 0; rc == 0 && i < l.n; i++)
		*resolved += sweep_refund(pay, h, &l.c[i]);
	free(buf);
	return rc;
}

/* A router sweeps each shard, each under its own lease. */
static int sweep_shards(idem_pay *pay, int64_t age_ms, int *ran, int *resolved)
{
	int rc;

	for (int i = 0; i < pay->nshards; i++) {
		int r = 0, n = 0;

		if ((rc = idem_pay_sweep(pay->shards[i], age_ms, &r, &n)) < 0)
			return rc;
		if (ran)
			*ran |= r;
		if (resolved)
			*resolved += n;
	}
	return 0;
}

/* Payments 'creating' since now - age_ms or longer whose claim no one holds. */
static int stale_payments(idem_pay *pay, int64_t now, int64_t age_ms, cands *list)
{
	idem_value v[2] = {IDEM_V_INT(now - age_ms), IDEM_V_INT(now)};

	return idem_store_query(
	    pay->store,
	    "SELECT id, merchant_id, channel, idem_key, updated_at, amount FROM payments"
	    " WHERE status = 'creating' AND updated_at <= ? AND NOT EXISTS ("
	    "SELECT 1 FROM idem_records r WHERE r.scope = payments.merchant_id"
	    " AND r.business_type = 'payment' AND r.idem_key = payments.idem_key"
	    " AND r.status = 'PROCESSING' AND r.lease_until > ?)"
	    " ORDER BY updated_at LIMIT 100",
	    v, 2, read_cand, list);
}

/*
 * Resolve each payment of list, renewing the lease before each one. When
 * the lease is lost, l->held is 0 on return and the pass ends: whoever
 * holds it now goes on.
 */
static int sweep_payments(idem_pay *pay, CURL *h, lease *l, const cands *list, int *resolved)
{
	int rc = 0;

	for (int i = 0; rc == 0 && i < list->n; i++) {
		int n;

		l->now = pay__now(pay);
		l->until = l->now + LEASE_MS;
		if ((rc = idem_store_transact(pay->store, lease_step, l)) < 0 || !l->held)
			return rc;
		n = sweep_one(pay, h, &list->c[i], pay__now(pay));

		if (resolved)
			*resolved += n;
	}
	return rc;
}

int idem_pay_sweep(idem_pay *pay, int64_t age_ms, int *ran, int *resolved)
{
	char holder[33];
	int64_t now;
	lease l;
	cand *buf = NULL;
	cands list = {NULL, 0};
	CURL *h = NULL;
	int rc;

	if (ran)
		*ran = 0;
	if (resolved)
		*resolved = 0;
	IDEM__ASSERT_ARG(pay);
	if (age_ms < 0)
		return idem__error(IDEM_EINVAL, "idem_pay_sweep: age_ms must not be negative");
	if (pay->nshards)
		return sweep_shards(pay, age_ms, ran, resolved);
	if ((rc = idem__rand_hex(holder, 16)) < 0)
		return rc;
	now = pay__now(pay);
	l = (lease){holder, now, now + LEASE_MS, 0};
	if ((rc = idem_store_transact(pay->store, lease_step, &l)) < 0 || !l.held)
		return rc;
	pay__sweep_count(pay, NULL);
	if (ran)
		*ran = 1;
	if (!(buf = calloc(SWEEP_BATCH, sizeof(cand))) || !(h = curl_easy_init())) {
		rc = idem__error(IDEM_ENOMEM, "out of memory");
		goto release;
	}
	list.c = buf;
	if ((rc = stale_payments(pay, now, age_ms, &list)) == 0)
		rc = sweep_payments(pay, h, &l, &list, resolved);
	if (rc == 0 && l.held) {
		int n = 0;

		rc = settle_orphans(pay, pay__now(pay), &n);
		if (rc == 0)
			rc = sweep_refunds(pay, h, pay__now(pay), age_ms, &n);
		if (resolved)
			*resolved += n;
	}
release:
	l.now = pay__now(pay);
	idem_store_transact(pay->store, release_step, &l);
	if (h)
		curl_easy_cleanup(h);
	free(buf);
	return rc;
}

/* ---- the thread ---------------------------------------------------------- */

static void sweep_pass(void *arg)
{
	pay__sweeper *s = arg;

	idem_pay_sweep(s->pay, s->age_ms, NULL, NULL);
}

int idem_pay_sweeper_start(idem_pay *pay, int64_t interval_ms, int64_t age_ms)
{
	pay__sweeper *s;
	int rc;

	IDEM__ASSERT_ARG(pay);
	if (interval_ms < 10 || age_ms < 0)
		return idem__error(IDEM_EINVAL, "sweeper: interval >= 10 ms, age >= 0");
	for (int i = 0; i < pay->nshards; i++) { /* one sweeper per shard */
		if ((rc = idem_pay_sweeper_start(pay->shards[i], interval_ms, age_ms)) < 0)
			return rc;
	}
	if (pay->nshards)
		return 0;
	if (pay->sweeper)
		return idem__error(IDEM_EINVAL, "the sweeper runs already");
	if (!(s = calloc(1, sizeof(*s))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	s->pay = pay;
	s->age_ms = age_ms;
	/* The first pass after one interval: a fresh start has nothing old. */
	if ((rc = pay__ticker_start(&s->ticker, interval_ms, 0, sweep_pass, s)) < 0) {
		free(s);
		return rc;
	}
	pay->sweeper = s;
	return 0;
}

void pay__sweeper_stop(idem_pay *pay)
{
	if (!pay->sweeper)
		return;
	pay__ticker_stop(pay->sweeper->ticker);
	free(pay->sweeper);
	pay->sweeper = NULL;
}
