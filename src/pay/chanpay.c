/*
 * pay/chanpay.c: payments on a connected channel, in two phases
 * (CHANNEL.md). Phase one commits the PROCESSING claim together with the
 * payment row in status 'creating': its id is the out_trade_no, so every
 * retry and every takeover sends the same number downstream. Then a pool
 * worker calls POST /orders with no transaction open, and the answer decides:
 *  - OK: the payment moves to the channel's status (a SUCCESS credits the
 *    merchant once), the 201 is stored with the completed claim;
 *  - a refusal with a code: the payment fails, 402 channel_declined stored;
 *  - anything else is unknown: the payment stays 'creating', the claim is
 *    released so the client's retry takes over at once, and the answer is
 *    503 channel_unavailable, not stored. Nothing is guessed; the sweeper
 *    (sweeper.c) resolves what no client comes back for.
 */
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pay/channel.h"
#include "pay/payment.h"
#include "util/error.h"

#define ORDER_EXPIRY_MS (30LL * 60 * 1000) /* expire_at sent with a create */

/* ---- the payment's state from the channel's order status --------------- */

static int set_status(idem_txn *txn, const char *id, const char *to, const char *from_sql,
                      const char *txn_id, int64_t now, int64_t *changed)
{
	char sql[256];
	idem_value v[4] = {IDEM_V_TEXT(to), txn_id ? IDEM_V_TEXT(txn_id) : IDEM_V_NULL,
	                   IDEM_V_INT(now), IDEM_V_TEXT(id)};

	snprintf(sql, sizeof(sql),
	         "UPDATE payments SET status = ?, channel_txn_id = COALESCE(?, channel_txn_id),"
	         " updated_at = ? WHERE id = ? AND status IN (%s)",
	         from_sql);
	return idem_txn_exec(txn, sql, v, 4, changed);
}

int pay__apply_order_status(idem_pay *pay, idem_txn *txn, const char *payment_id,
                            const char *status, const char *channel_txn_id, int *changed)
{
	pay__payment p = {0};
	int64_t now = pay__now(pay), n = 0;
	int rc;

	*changed = 0;
	if ((rc = pay__payment_load(pay, txn, &p, NULL, payment_id)) < 0)
		goto done;
	if (!p.found) {
		rc = idem__error(IDEM_ENOTFOUND, "no payment %s", payment_id);
		goto done;
	}
	if (strcmp(status, "PENDING") == 0) {
		rc = set_status(txn, p.id, "processing", "'creating'", channel_txn_id, now, &n);
	} else if (strcmp(status, "SUCCESS") == 0) {
		int fits = 0;

		if (strcmp(p.status, "creating") != 0 && strcmp(p.status, "processing") != 0)
			goto done; /* final already: nothing to credit */
		if ((rc = pay__lock_merchant(txn, p.merchant_id, now)) < 0 ||
		    (rc = pay__credit_fits(txn, p.merchant_id, p.currency, p.amount, &fits)) < 0)
			goto done;
		if (!fits) {
			rc = idem__error(IDEM_ECONSTRAINT, "crediting payment %s would overflow",
			                 p.id);
			goto done;
		}
		rc = set_status(txn, p.id, "succeeded", "'creating','processing'", channel_txn_id,
		                now, &n);
		if (rc == 0 && n == 1)
			rc = pay__post(txn, p.merchant_id, p.currency, p.amount, "payment", p.id,
			               now);
	} else if (strcmp(status, "FAILED") == 0 || strcmp(status, "CLOSED") == 0) {
		rc = set_status(txn, p.id, "failed", "'creating','processing'", channel_txn_id, now,
		                &n);
	} else {
		rc = idem__error(IDEM_EINVAL, "unknown order status");
	}
	*changed = rc == 0 && n == 1;
done:
	pay__payment_clear(&p);
	return rc;
}

int pay__fail_payment(idem_txn *txn, const char *id, const char *code, int64_t now)
{
	idem_value v[3] = {IDEM_V_TEXT(code), IDEM_V_INT(now), IDEM_V_TEXT(id)};

	return idem_txn_exec(
	    txn,
	    "UPDATE payments SET status = 'failed', channel_code = ?, updated_at = ?"
	    " WHERE id = ? AND status = 'creating'",
	    v, 3, NULL);
}

/* ---- phase one: the claim and the payment row -------------------------- */

static int insert_creating(idem_txn *txn, pay__op *c, const char *id, int64_t now)
{
	json_t *d = c->doc, *meta = json_object_get(d, "metadata");
	const char *desc = pay__str(d, "description");
	char *meta_text = NULL;
	int rc;

	if (meta && !(meta_text = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS)))
		return idem__error(IDEM_ENOMEM, "out of memory");
	{
		idem_value v[12] = {
		    IDEM_V_TEXT(id),
		    IDEM_V_TEXT(c->rq->caller),
		    IDEM_V_TEXT(pay__str(d, "merchant_order_no")),
		    IDEM_V_INT(pay__int(d, "amount")),
		    IDEM_V_TEXT(pay__str(d, "currency")),
		    IDEM_V_TEXT(pay__str(d, "channel")),
		    desc ? IDEM_V_TEXT(desc) : IDEM_V_NULL,
		    meta_text ? IDEM_V_TEXT(meta_text) : IDEM_V_NULL,
		    IDEM_V_TEXT(c->fp),
		    IDEM_V_INT(now),
		    IDEM_V_INT(now),
		    IDEM_V_TEXTN(c->req.key, c->req.key_len),
		};

		rc = idem_txn_try_exec(
		    txn,
		    "INSERT INTO payments (id, merchant_id, merchant_order_no, amount,"
		    " currency, channel, description, metadata, status, refunded_amount,"
		    " fingerprint, created_at, updated_at, idem_key)"
		    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'creating', 0, ?, ?, ?, ?)",
		    v, 12, NULL);
	}
	free(meta_text);
	return rc;
}

static int read_key_code(void *ctx, const idem_value *c, int n)
{
	pay__key_code *k = ctx;

	if (n != 2)
		return idem__error(IDEM_ESTORE, "row has %d columns", n);
	pay__col_text(k->key, sizeof(k->key), &c[0]);
	pay__col_text(k->code, sizeof(k->code), &c[1]);
	return 1;
}

int pay__own_row(idem_txn *txn, const char *table, const char *id, const idem_request *req,
                 pay__key_code *out)
{
	idem_value v[1] = {IDEM_V_TEXT(id)};
	int rc;

	memset(out, 0, sizeof(*out));
	rc = idem_txn_query(txn,
	                    strcmp(table, "refunds") == 0
	                        ? "SELECT idem_key, channel_code FROM refunds WHERE id = ?"
	                        : "SELECT idem_key, channel_code FROM payments WHERE id = ?",
	                    v, 1, read_key_code, out);
	if (rc < 0)
		return rc;
	return strlen(out->key) == req->key_len && memcmp(out->key, req->key, req->key_len) == 0;
}

/* The payment row p as the answer with status. */
static int payment_json(idem_response *resp, int status, const pay__payment *p)
{
	json_t *obj = pay__payment_object(p);
	int rc;

	if (!obj)
		return idem__error(IDEM_ENOMEM, "out of memory");
	rc = pay__json(resp, status, obj);
	json_decref(obj);
	return rc;
}

int pay__payment_answer(idem_pay *pay, idem_txn *txn, const char *merchant, const char *id,
                        int status, idem_response *resp)
{
	pay__payment p = {0};
	int rc;

	if ((rc = pay__payment_load(pay, txn, &p, merchant, id)) == 0)
		rc = p.found ? payment_json(resp, status, &p) : IDEM_ENOTFOUND;
	pay__payment_clear(&p);
	return rc;
}

/*
 * A payment resolved since this key's last attempt (by the sweeper or a
 * notification, after a 503 released the claim): the retry gets the answer
 * the first attempt would have had, 201 with the payment, or the 402 of the
 * channel's refusal (ORDER_CLOSED when the sweeper closed it). 1 when
 * answered; 0 when the payment is another request's (the backstop's case).
 */
static int own_payment(idem_txn *txn, pay__op *c, const pay__payment *p, idem_response *resp)
{
	pay__key_code k;
	int rc;

	if ((rc = pay__own_row(txn, "payments", p->id, &c->req, &k)) <= 0)
		return rc;
	if (strcmp(p->status, "failed") == 0 && k.code[0])
		rc = pay__declined_problem(resp, k.code);
	else
		rc = payment_json(resp, 201, p);
	return rc < 0 ? rc : 1;
}

static int create_prep(idem_txn *txn, void *ctx, idem_response *resp)
{
	pay__chjob *j = ctx;
	pay__op *c = j->op;
	pay__payment p = {0};
	json_t *obj = NULL;
	int64_t now = pay__now(c->pay), n = 0;
	int rc;

	rc = pay__payment_load_by_order(c->pay, txn, &p, c->rq->caller,
	                                pay__str(c->doc, "merchant_order_no"));
	if (rc < 0)
		goto done;
	if (!p.found) {
		if ((rc = pay__new_id(j->id, "pay_", c->pay->shard)) < 0)
			goto done;
		rc = insert_creating(txn, c, j->id, now);
		if (rc == IDEM_ECONFLICT) /* inserted meanwhile under another key */
			rc = idem__error(IDEM_ERETRY, "payment row appeared during the claim");
		goto done;
	}
	if (strcmp(p.fingerprint, c->fp) == 0 && strcmp(p.status, "creating") != 0 &&
	    (rc = own_payment(txn, c, &p, resp)) != 0) {
		rc = rc < 0 ? rc : 0; /* this key's own payment: its answer */
		goto done;
	}
	if (strcmp(p.status, "creating") == 0 && strcmp(p.fingerprint, c->fp) == 0) {
		/* A retry, or a takeover: the same out_trade_no goes out again. The
		 * sweeper's age counts from the latest attempt. */
		idem_value v[2] = {IDEM_V_INT(now), IDEM_V_TEXT(p.id)};

		memcpy(j->id, p.id, sizeof(j->id));
		rc = idem_txn_exec(
		    txn, "UPDATE payments SET updated_at = ? WHERE id = ? AND status = 'creating'",
		    v, 2, &n);
		goto done;
	}
	/* The order number exists, final or another request's: the backstop. */
	if (!(obj = pay__payment_object(&p))) {
		rc = idem__error(IDEM_ENOMEM, "out of memory");
		goto done;
	}
	rc = pay__backstop(resp, obj, p.id, p.fingerprint, c->fp, "payment");
done:
	json_decref(obj);
	pay__payment_clear(&p);
	return rc;
}

/* ---- phase two: the answer lands with the completion ------------------- */

static int answer_payment(idem_txn *txn, pay__op *c, const char *id, int status,
                          idem_response *resp)
{
	int rc = pay__payment_answer(c->pay, txn, c->rq->caller, id, status, resp);

	if (rc == IDEM_ENOTFOUND)
		rc = idem__error(IDEM_ESTORE, "payment %s vanished", id);
	return rc;
}

static int ok_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	pay__chjob *j = ctx;
	const char *status = json_string_value(json_object_get(j->reply.doc, "status"));
	const char *txn_id = json_string_value(json_object_get(j->reply.doc, "channel_txn_id"));
	int changed = 0, rc;

	if ((rc = pay__apply_order_status(j->op->pay, txn, j->id, status, txn_id, &changed)) < 0)
		return rc;
	return answer_payment(txn, j->op, j->id, 201, resp);
}

int pay__declined_problem(idem_response *resp, const char *code)
{
	char *body = NULL;
	size_t len = 0;
	int rc;

	if ((rc = idem_pay_problem(&body, &len, 402, "channel_declined",
	                           "the payment channel refused the request", "channel_code",
	                           code)) < 0)
		return rc;
	rc = idem_response_set(resp, 402, body, len);
	free(body);
	return rc;
}

static int declined_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	pay__chjob *j = ctx;
	int rc;

	if ((rc = pay__fail_payment(txn, j->id, j->reply.code, pay__now(j->op->pay))) < 0)
		return rc;
	return pay__declined_problem(resp, j->reply.code);
}

/* The 503 of an unknown outcome: not stored, the claim released. */
int pay__unavailable(idem_result *res, const char *what, const char *why)
{
	char detail[256];
	char *body = NULL;
	size_t len = 0;
	int rc;

	snprintf(detail, sizeof(detail),
	         "the payment channel gave no definite answer to the %s (%s); retry with the "
	         "same request",
	         what, why);
	idem_result_clear(res);
	if ((rc = idem_pay_problem(&body, &len, 503, "channel_unavailable", detail, NULL, NULL)) <
	    0)
		return rc;
	res->outcome = IDEM_FIRST;
	res->http_status = 503;
	res->body = (unsigned char *)body;
	res->body_len = len;
	res->stored = 0;
	return 0;
}

/* A valid order answer names our number and a known status. */
static int order_answer_valid(const pay__ch_reply *r, const char *id)
{
	const char *no = json_string_value(json_object_get(r->doc, "out_trade_no"));
	const char *st = json_string_value(json_object_get(r->doc, "status"));

	return no && st && strcmp(no, id) == 0 &&
	       (strcmp(st, "PENDING") == 0 || strcmp(st, "SUCCESS") == 0 ||
	        strcmp(st, "FAILED") == 0 || strcmp(st, "CLOSED") == 0);
}

static char *create_body(const pay__chjob *j)
{
	pay__op *c = j->op;
	char expire[32], notify[700];
	json_t *o;
	char *s;

	pay__time(expire, pay__now(c->pay) + ORDER_EXPIRY_MS);
	snprintf(notify, sizeof(notify), "%s/v1/notifications/%s", c->pay->public_url, j->ch.name);
	o = json_pack("{s:s, s:I, s:s, s:s, s:s}", "out_trade_no", j->id, "amount",
	              (json_int_t)pay__int(c->doc, "amount"), "currency",
	              pay__str(c->doc, "currency"), "notify_url",
	              c->pay->public_url[0] ? notify : "", "expire_at", expire);
	s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return s;
}

static void flow_run(pay__job *job, CURL *h)
{
	pay__chjob *j = (pay__chjob *)job;
	const pay__flow *f = j->flow;
	pay__op *c = j->op;
	idem_claim *claim = NULL;
	idem_result res = {0};
	char *body = NULL;
	int rc;

	rc = idem_claim_begin_with(&claim, &res, c->pay->store, &c->req, f->prep, j);
	if (rc < 0 || !claim)
		goto answer; /* a store error, a duplicate, or prep's own answer */
	idem_result_clear(&res);
	if (!h || !(body = f->body(j))) {
		idem_claim_abort(claim);
		rc = pay__unavailable(&res, f->what, "out of memory");
		goto answer;
	}
	pay__ch_call(c->pay, h, &j->ch, f->call, "POST", f->path, body, &j->reply);
	pay__after_channel(c->pay);
	if (j->reply.outcome == PAY__CH_OK && !f->answer_valid(&j->reply, j->id)) {
		j->reply.outcome = PAY__CH_UNKNOWN;
		snprintf(j->reply.why, sizeof(j->reply.why), "an OK answer for another number");
	}
	if (j->reply.outcome == PAY__CH_UNKNOWN) {
		/* Never guess: it may have taken effect. The retry takes over at
		 * once and sends the same number. */
		idem_claim_abort(claim);
		rc = pay__unavailable(&res, f->what, j->reply.why);
		goto answer;
	}
	rc = idem_claim_finish(&res, claim,
	                       j->reply.outcome == PAY__CH_OK ? f->ok_work : f->declined_work, j);
	if (rc < 0 && rc != IDEM_ELEASE)
		idem_claim_abort(claim); /* the retry asks the channel again: same number */
	if (rc == IDEM_ELEASE)
		rc = idem__error(IDEM_ERETRY, "lease lost while calling the channel");
answer:
	free(body);
	idem_claim_free(claim);
	pay__ch_reply_clear(&j->reply);
	OPENSSL_cleanse(&j->ch, sizeof(j->ch));
	pay__op_done(c, rc, &res); /* frees the op */
	idem_result_clear(&res);
	free(j);
}

void pay__chan_start(pay__op *op, const pay__chan *ch, const pay__flow *flow)
{
	pay__pool *pool = pay__pool_get(op->pay);
	pay__chjob *j = pool ? calloc(1, sizeof(*j)) : NULL;

	if (!j) {
		pay__finish(op, idem__error(IDEM_ENOMEM, "cannot start a channel call"));
		return;
	}
	j->job.run = flow_run;
	j->flow = flow;
	j->op = op;
	j->ch = *ch;
	if (pay__pool_submit(pool, &j->job) == 0)
		return;
	OPENSSL_cleanse(&j->ch, sizeof(j->ch));
	free(j);
	pay__reject(&op->res, 503, "channel_busy",
	            "too many channel calls are waiting; retry later");
	pay__finish(op, 0);
}

static const pay__flow payment_flow = {
    "create call", PAY__CALL_CREATE, "/orders",   create_prep,
    ok_work,       declined_work,    create_body, order_answer_valid,
};

void pay__chan_payment_start(pay__op *op, const pay__chan *ch)
{
	pay__op_request(op, "payment", pay__str(op->doc, "merchant_order_no"), op->pay->opts.ttl_ms,
	                1);
	pay__chan_start(op, ch, &payment_flow);
}
