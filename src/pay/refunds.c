/*
 * pay/refunds.c: refunds. Every check a refund can fail (payment state,
 * remaining amount, merchant balance) is made under the merchant's lock
 * before anything is written, so a refused refund is stored as its 409 with
 * no business row changed, and two refunds racing for the last of a balance
 * cannot both pass. The payment's UPDATE is still conditional (state
 * machine): it must change exactly one row.
 */
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pay/channel.h"
#include "pay/payment.h"
#include "util/error.h"

typedef struct {
	char id[IDEM_PAY_ID_SIZE];
	char fingerprint[IDEM_FINGERPRINT_LEN + 1];
	char payment_id[IDEM_PAY_ID_SIZE];
	char currency[8];
	char request_no[72];
	char reason[300];
	char status[16];
	int64_t amount, created_at;
	int has_reason, found;
} refund_row;

static int read_refund(void *ctx, const idem_value *c, int n)
{
	refund_row *r = ctx;

	if (n != 9)
		return idem__error(IDEM_ESTORE, "refund row has %d columns", n);
	pay__col_text(r->id, sizeof(r->id), &c[0]);
	pay__col_text(r->request_no, sizeof(r->request_no), &c[1]);
	pay__col_text(r->payment_id, sizeof(r->payment_id), &c[2]);
	r->amount = c[3].i;
	pay__col_text(r->currency, sizeof(r->currency), &c[4]);
	r->has_reason = c[5].type != IDEM_VAL_NULL;
	pay__col_text(r->reason, sizeof(r->reason), &c[5]);
	pay__col_text(r->status, sizeof(r->status), &c[6]);
	pay__col_text(r->fingerprint, sizeof(r->fingerprint), &c[7]);
	r->created_at = c[8].i;
	r->found = 1;
	return 1;
}

static json_t *refund_object(const refund_row *r)
{
	char created[32];

	pay__time(created, r->created_at);
	return json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:s?, s:s, s:s}", "id", r->id, "object",
	                 "refund", "refund_request_no", r->request_no, "payment_id", r->payment_id,
	                 "amount", (json_int_t)r->amount, "currency", r->currency, "reason",
	                 r->has_reason ? r->reason : NULL, "status", r->status, "created_at",
	                 created);
}

static int load_refund(idem_txn *txn, refund_row *r, const char *sql, const char *a, const char *b)
{
	idem_value p[2] = {IDEM_V_TEXT(a), IDEM_V_TEXT(b)};

	memset(r, 0, sizeof(*r));
	return idem_txn_query(txn, sql, p, 2, read_refund, r);
}

#define REFUND_COLS                                                                                \
	"SELECT id, refund_request_no, payment_id, amount, currency, reason, status, "             \
	"fingerprint, created_at FROM refunds "

static int answer_row(idem_response *resp, int status, const refund_row *r)
{
	json_t *obj = refund_object(r);
	int rc;

	if (!obj)
		return idem__error(IDEM_ENOMEM, "out of memory");
	rc = pay__json(resp, status, obj);
	json_decref(obj);
	return rc;
}

/*
 * A channel refund resolved since this key's last attempt (the sweeper, after
 * a 503 released the claim): the retry gets the answer the first attempt
 * would have had, 201 with the refund or the 402 of the channel's refusal.
 * 1 when answered; 0 when the refund is another request's (the backstop).
 */
static int own_refund(idem_txn *txn, pay__op *c, const refund_row *r, idem_response *resp)
{
	pay__key_code k;
	int rc;

	if ((rc = pay__own_row(txn, "refunds", r->id, &c->req, &k)) <= 0)
		return rc;
	if (strcmp(r->status, "failed") == 0 && k.code[0])
		rc = pay__declined_problem(resp, k.code);
	else
		rc = answer_row(resp, 201, r);
	return rc < 0 ? rc : 1;
}

int pay__refund_set_code(idem_txn *txn, const char *id, const char *code)
{
	idem_value v[2] = {IDEM_V_TEXT(code), IDEM_V_TEXT(id)};

	return idem_txn_exec(txn, "UPDATE refunds SET channel_code = ? WHERE id = ?", v, 2, NULL);
}

/*
 * Every check, then the refund row, the payment's refunded amount and the
 * debit, under the merchant's lock. to_channel: the row is 'creating' (the
 * channel has yet to answer: the amount is reserved meanwhile) and its id is
 * copied to id_out; a retry of a refund still 'creating' finds it again
 * (id_out set, resp left empty: the claim stays held for the channel call).
 */
/*
 * A refund under this request number exists already: the same one retried
 * (a channel refund still 'creating' goes out again under its number: 1 with
 * id_out set), this key's own answer, the backstop's 200, or 409. 0 when the
 * answer is in resp; 1 to keep the claim for the channel call.
 */
static int existing_refund(idem_txn *txn, pay__op *c, refund_row *r, idem_response *resp,
                           int to_channel, char id_out[IDEM_PAY_ID_SIZE])
{
	char *body = NULL;
	size_t len = 0;
	int same = strcmp(r->fingerprint, c->fp) == 0, rc;

	if (to_channel && same && strcmp(r->status, "creating") == 0) {
		memcpy(id_out, r->id, IDEM_PAY_ID_SIZE); /* the same out_refund_no again */
		return 1;
	}
	if (to_channel && same && (rc = own_refund(txn, c, r, resp)) != 0)
		return rc < 0 ? rc : 0; /* this key's own refund: its answer */
	if (same)
		return answer_row(resp, 200, r);
	rc = idem_pay_problem(&body, &len, 409, "business_key_conflict",
	                      "a different refund already uses this refund_request_no",
	                      "existing_id", r->id);
	if (rc == 0)
		rc = idem_response_set(resp, 409, body, len);
	free(body);
	return rc;
}

/* The refusals a refund can meet, in order: 1 when one is in resp. */
static int refusal(idem_txn *txn, const pay__payment *p, int64_t amount, idem_response *resp)
{
	int64_t balance = 0;
	int rc;

	if (!p->found) {
		resp->persist = 0;
		rc = pay__problem(resp, 404, "not_found", "no such payment");
	} else if (strcmp(p->status, "succeeded") != 0 &&
	           strcmp(p->status, "partially_refunded") != 0) {
		rc = pay__problem(resp, 409, "payment_not_refundable",
		                  "only a succeeded or partially refunded payment can be refunded");
	} else if (amount > p->amount - p->refunded) {
		rc = pay__problem(resp, 409, "refund_exceeds_payment",
		                  "the refunds would exceed the amount paid");
	} else if ((rc = pay__balance(txn, p->merchant_id, p->currency, &balance)) < 0) {
		return rc;
	} else if (balance < amount) {
		rc = pay__problem(resp, 409, "insufficient_balance",
		                  "the merchant's balance cannot cover this refund");
	} else {
		return 0;
	}
	return rc < 0 ? rc : 1;
}

/* The refund row (status), the payment's refunded amount, the debit. */
static int write_refund(idem_txn *txn, pay__op *c, const pay__payment *p, const char *id,
                        const char *status, int64_t now)
{
	json_t *d = c->doc;
	const char *reason = pay__str(d, "reason");
	int64_t amount = pay__int(d, "amount"), changed = 0;
	int to_channel = strcmp(status, "creating") == 0, rc;
	idem_value v[12] = {IDEM_V_TEXT(id),
	                    IDEM_V_TEXT(c->rq->caller),
	                    IDEM_V_TEXT(pay__str(d, "refund_request_no")),
	                    IDEM_V_TEXT(p->id),
	                    IDEM_V_INT(amount),
	                    IDEM_V_TEXT(p->currency),
	                    reason ? IDEM_V_TEXT(reason) : IDEM_V_NULL,
	                    IDEM_V_TEXT(status),
	                    IDEM_V_TEXT(c->fp),
	                    IDEM_V_INT(now),
	                    IDEM_V_INT(now),
	                    to_channel ? IDEM_V_TEXTN(c->req.key, c->req.key_len) : IDEM_V_NULL};
	idem_value w[5] = {IDEM_V_INT(amount), IDEM_V_INT(amount), IDEM_V_INT(now),
	                   IDEM_V_TEXT(p->id), IDEM_V_INT(amount)};

	if ((rc = idem_txn_exec(txn,
	                        "INSERT INTO refunds (id, merchant_id, refund_request_no,"
	                        " payment_id, amount, currency, reason, status, fingerprint,"
	                        " created_at, updated_at, idem_key)"
	                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
	                        v, 12, NULL)) < 0)
		return rc;
	rc = idem_txn_exec(txn,
	                   "UPDATE payments SET refunded_amount = refunded_amount + ?,"
	                   " status = CASE WHEN refunded_amount + ? = amount THEN 'refunded'"
	                   " ELSE 'partially_refunded' END, updated_at = ?"
	                   " WHERE id = ? AND status IN ('succeeded', 'partially_refunded')"
	                   " AND refunded_amount + ? <= amount",
	                   w, 5, &changed);
	if (rc == 0 && changed != 1)
		rc = idem__error(IDEM_ERETRY, "payment changed during refund");
	if (rc == 0)
		rc = pay__post(txn, c->rq->caller, p->currency, -amount, "refund", id, now);
	return rc;
}

/*
 * Every check, then the refund row, the payment's refunded amount and the
 * debit, under the merchant's lock. to_channel: the row is 'creating' (the
 * channel has yet to answer: the amount is reserved meanwhile) and its id is
 * copied to id_out; a retry of a refund still 'creating' finds it again
 * (id_out set, resp left empty: the claim stays held for the channel call).
 */
static int reserve(idem_txn *txn, pay__op *c, idem_response *resp, int to_channel,
                   char id_out[IDEM_PAY_ID_SIZE])
{
	json_t *d = c->doc;
	const char *merchant = c->rq->caller;
	int64_t now = pay__now(c->pay);
	pay__payment p = {0};
	refund_row r;
	int rc;

	memset(&r, 0, sizeof(r));
	if ((rc = pay__lock_merchant(txn, merchant, now)) < 0)
		goto done;
	/* Backstop first: a refund under this request number exists already.
	 * A read can decide this here because every refund of the merchant
	 * holds the merchant's lock; the unique index stays the last word. */
	if ((rc =
	         load_refund(txn, &r, REFUND_COLS "WHERE merchant_id = ? AND refund_request_no = ?",
	                     merchant, pay__str(d, "refund_request_no"))) < 0)
		goto done;
	if (r.found) {
		rc = existing_refund(txn, c, &r, resp, to_channel, id_out);
		rc = rc < 0 ? rc : 0;
		goto done;
	}
	if ((rc = pay__payment_load(c->pay, txn, &p, merchant, pay__str(d, "payment_id"))) < 0 ||
	    (rc = refusal(txn, &p, pay__int(d, "amount"), resp)) != 0) {
		rc = rc < 0 ? rc : 0;
		goto done;
	}
	if ((rc = pay__new_id(r.id, "re_", c->pay->shard)) < 0 ||
	    (rc = write_refund(txn, c, &p, r.id, to_channel ? "creating" : "succeeded", now)) < 0)
		goto done;
	if (to_channel) {
		memcpy(id_out, r.id, IDEM_PAY_ID_SIZE);
		goto done;
	}
	rc = pay__refund_answer(txn, merchant, r.id, resp);
done:
	pay__payment_clear(&p);
	return rc;
}

static int refund_work(idem_txn *txn, void *vctx, idem_response *resp)
{
	char unused[IDEM_PAY_ID_SIZE];

	return reserve(txn, vctx, resp, 0, unused);
}

static int start_on_channel(pay__op *op);

static const pay__field refund_fields[] = {
    {"refund_request_no", F_STRING, 0, V_NATURAL_KEY, 1},
    {"payment_id", F_STRING, 1, V_ID, 0},
    {"amount", F_INT, 1, V_AMOUNT, 0},
    {"reason", F_STRING, 0, V_TEXT255, 0},
};

void idem_pay_refund_async(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                           void *done_ctx)
{
	pay__op *c;
	const char *no;
	idem_result *out;
	int rc;

	if (!pay__async_args(__func__, pay, rq, done, done_ctx) ||
	    !(pay = pay__route_async(pay, rq->caller, done, done_ctx)) ||
	    !(c = pay__op_new(pay, rq, done, done_ctx)))
		return;
	out = &c->res;
	if ((rc = pay__parse_request(&c->doc, out, rq, refund_fields,
	                             sizeof(refund_fields) / sizeof(refund_fields[0]))) < 0 ||
	    !c->doc) {
		pay__finish(c, rc);
		return;
	}
	no = pay__str(c->doc, "refund_request_no");
	if ((rc = pay__fingerprint(c->fp, rq, c->doc)) == 0) {
		if (start_on_channel(c))
			return;
		pay__start(c, "refund", no, pay->opts.ttl_ms, refund_work, NULL, 1);
		return;
	}
	pay__finish(c, rc);
}

int idem_pay_refund(idem_result *out, idem_pay *pay, const idem_pay_request *rq)
{
	IDEM__ASSERT_ARG(out); /* pay and rq: the async call answers them */
	return pay__wait(out, pay, rq, idem_pay_refund_async);
}

/* ---- refunds through a connected channel (CHANNEL.md) ------------------- */

/*
 * Move refund id of merchant to the channel's refund status. SUCCESS and
 * PROCESSING keep the reserved amount; FAILED gives it back (the payment's
 * refunded amount and the merchant's balance, with a "refund_reversal"
 * ledger entry) under the merchant's lock. *changed 1 when it moved.
 */
int pay__refund_apply_status(idem_pay *pay, idem_txn *txn, const char *merchant, const char *id,
                             const char *status, const char *channel_refund_id, int *changed)
{
	int64_t now = pay__now(pay), n = 0;
	refund_row r;
	int rc;

	*changed = 0;
	if (strcmp(status, "FAILED") == 0 && (rc = pay__lock_merchant(txn, merchant, now)) < 0)
		return rc;
	if ((rc = load_refund(txn, &r, REFUND_COLS "WHERE id = ? AND merchant_id = ?", id,
	                      merchant)) < 0)
		return rc;
	if (!r.found)
		return idem__error(IDEM_ENOTFOUND, "no refund %s", id);
	{
		const char *to = strcmp(status, "SUCCESS") == 0      ? "succeeded"
		                 : strcmp(status, "PROCESSING") == 0 ? "processing"
		                 : strcmp(status, "FAILED") == 0     ? "failed"
		                                                     : NULL;
		idem_value v[4] = {IDEM_V_NULL,
		                   channel_refund_id ? IDEM_V_TEXT(channel_refund_id) : IDEM_V_NULL,
		                   IDEM_V_INT(now), IDEM_V_TEXT(id)};

		if (!to)
			return idem__error(IDEM_EINVAL, "unknown refund status");
		v[0] = IDEM_V_TEXT(to);
		rc = idem_txn_exec(txn,
		                   strcmp(to, "processing") == 0
		                       ? "UPDATE refunds SET status = ?, channel_refund_id ="
		                         " COALESCE(?, channel_refund_id), updated_at = ?"
		                         " WHERE id = ? AND status = 'creating'"
		                       : "UPDATE refunds SET status = ?, channel_refund_id ="
		                         " COALESCE(?, channel_refund_id), updated_at = ?"
		                         " WHERE id = ? AND status IN ('creating', 'processing')",
		                   v, 4, &n);
	}
	if (rc < 0 || n != 1)
		return rc;
	*changed = 1;
	if (strcmp(status, "FAILED") != 0)
		return 0;
	{
		idem_value v[5] = {IDEM_V_INT(r.amount), IDEM_V_INT(r.amount), IDEM_V_INT(now),
		                   IDEM_V_TEXT(r.payment_id), IDEM_V_INT(r.amount)};

		rc = idem_txn_exec(txn,
		                   "UPDATE payments SET refunded_amount = refunded_amount - ?,"
		                   " status = CASE WHEN refunded_amount - ? = 0 THEN 'succeeded'"
		                   " ELSE 'partially_refunded' END, updated_at = ?"
		                   " WHERE id = ? AND refunded_amount >= ?",
		                   v, 5, &n);
	}
	if (rc == 0 && n != 1)
		rc = idem__error(IDEM_ESTORE, "payment of refund %s lost its refunded amount", id);
	if (rc == 0)
		rc = pay__post(txn, merchant, r.currency, r.amount, "refund_reversal", id, now);
	return rc;
}

static int refund_prep(idem_txn *txn, void *ctx, idem_response *resp)
{
	pay__chjob *j = ctx;

	return reserve(txn, j->op, resp, 1, j->id);
}

int pay__refund_answer(idem_txn *txn, const char *merchant, const char *id, idem_response *resp)
{
	refund_row r;
	int rc;

	if ((rc = load_refund(txn, &r, REFUND_COLS "WHERE id = ? AND merchant_id = ?", id,
	                      merchant)) < 0)
		return rc;
	if (!r.found)
		return idem__error(IDEM_ESTORE, "refund %s vanished", id);
	return answer_row(resp, 201, &r);
}

static int refund_answer(idem_txn *txn, pay__chjob *j, idem_response *resp)
{
	return pay__refund_answer(txn, j->op->rq->caller, j->id, resp);
}

static int refund_ok_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	pay__chjob *j = ctx;
	const char *st = json_string_value(json_object_get(j->reply.doc, "status"));
	const char *cid = json_string_value(json_object_get(j->reply.doc, "channel_refund_id"));
	int changed = 0, rc;

	if ((rc = pay__refund_apply_status(j->op->pay, txn, j->op->rq->caller, j->id, st, cid,
	                                   &changed)) < 0)
		return rc;
	return refund_answer(txn, j, resp);
}

static int refund_declined_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	pay__chjob *j = ctx;
	int changed = 0, rc;

	if ((rc = pay__refund_apply_status(j->op->pay, txn, j->op->rq->caller, j->id, "FAILED",
	                                   NULL, &changed)) < 0 ||
	    (rc = pay__refund_set_code(txn, j->id, j->reply.code)) < 0)
		return rc;
	return pay__declined_problem(resp, j->reply.code);
}

static int refund_answer_valid(const pay__ch_reply *r, const char *id)
{
	const char *no = json_string_value(json_object_get(r->doc, "out_refund_no"));
	const char *st = json_string_value(json_object_get(r->doc, "status"));

	return no && st && strcmp(no, id) == 0 &&
	       (strcmp(st, "SUCCESS") == 0 || strcmp(st, "PROCESSING") == 0 ||
	        strcmp(st, "FAILED") == 0);
}

char *pay__refund_body(const char *refund_id, const char *payment_id, int64_t amount)
{
	json_t *o = json_pack("{s:s, s:s, s:I}", "out_refund_no", refund_id, "out_trade_no",
	                      payment_id, "amount", (json_int_t)amount);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return s;
}

static char *refund_call_body(const pay__chjob *j)
{
	return pay__refund_body(j->id, pay__str(j->op->doc, "payment_id"),
	                        pay__int(j->op->doc, "amount"));
}

static const pay__flow refund_flow = {
    "refund call",  PAY__CALL_REFUND,     "/refunds",       refund_prep,
    refund_ok_work, refund_declined_work, refund_call_body, refund_answer_valid,
};

/* 1 (and the refund started) when the payment is on a connected channel. */
static int start_on_channel(pay__op *op)
{
	pay__payment p = {0};
	pay__chan ch;
	int found = 0, on = 0, rc;

	memset(&ch, 0, sizeof(ch));
	if ((rc = pay__payment_load(op->pay, NULL, &p, op->rq->caller,
	                            pay__str(op->doc, "payment_id"))) < 0 ||
	    (p.found && strcmp(p.channel, "mock") != 0 &&
	     (rc = pay__chan_get(op->pay, p.channel, &ch, &found)) < 0)) {
		/* The store failed (its deadline passed): answer that now, not after a
		 * second deadline on the atomic path. */
		pay__finish(op, rc);
		on = 1;
		goto done;
	}
	if (!p.found || !found || !ch.base_url[0])
		goto done; /* the atomic path answers (404 for no payment) */
	on = 1;
	pay__op_request(op, "refund", pay__str(op->doc, "refund_request_no"), op->pay->opts.ttl_ms,
	                1);
	pay__chan_start(op, &ch, &refund_flow);
done:
	OPENSSL_cleanse(&ch, sizeof(ch));
	pay__payment_clear(&p);
	return on;
}
