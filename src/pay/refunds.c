/*
 * pay/refunds.c: refunds. Every check a refund can fail (payment state,
 * remaining amount, merchant balance) is made under the merchant's lock
 * before anything is written, so a refused refund is stored as its 409 with
 * no business row changed, and two refunds racing for the last of a balance
 * cannot both pass. The payment's UPDATE is still conditional (state
 * machine): it must change exactly one row.
 */
#include <stdlib.h>
#include <string.h>

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

static int refund_work(idem_txn *txn, void *vctx, idem_response *resp)
{
	pay__op *c = vctx;
	json_t *d = c->doc;
	const char *merchant = c->rq->caller, *reason = pay__str(d, "reason");
	int64_t amount = pay__int(d, "amount"), now = pay__now(c->pay), balance = 0, changed = 0;
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
		char *body = NULL;
		size_t len = 0;

		if (strcmp(r.fingerprint, c->fp) == 0) {
			rc = answer_row(resp, 200, &r);
			goto done;
		}
		rc = idem_pay_problem(&body, &len, 409, "business_key_conflict",
		                      "a different refund already uses this refund_request_no",
		                      "existing_id", r.id);
		if (rc == 0)
			rc = idem_response_set(resp, 409, body, len);
		free(body);
		goto done;
	}
	if ((rc = pay__payment_load(c->pay, txn, &p, merchant, pay__str(d, "payment_id"))) < 0)
		goto done;
	if (!p.found) {
		resp->persist = 0;
		rc = pay__problem(resp, 404, "not_found", "no such payment");
		goto done;
	}
	if (strcmp(p.status, "succeeded") != 0 && strcmp(p.status, "partially_refunded") != 0) {
		rc = pay__problem(resp, 409, "payment_not_refundable",
		                  "only a succeeded or partially refunded payment can be refunded");
		goto done;
	}
	if (amount > p.amount - p.refunded) {
		rc = pay__problem(resp, 409, "refund_exceeds_payment",
		                  "the refunds would exceed the amount paid");
		goto done;
	}
	if ((rc = pay__balance(txn, merchant, p.currency, &balance)) < 0)
		goto done;
	if (balance < amount) {
		rc = pay__problem(resp, 409, "insufficient_balance",
		                  "the merchant's balance cannot cover this refund");
		goto done;
	}
	if ((rc = pay__new_id(r.id, "re_")) < 0)
		goto done;
	{
		idem_value v[9] = {IDEM_V_TEXT(r.id),
		                   IDEM_V_TEXT(merchant),
		                   IDEM_V_TEXT(pay__str(d, "refund_request_no")),
		                   IDEM_V_TEXT(p.id),
		                   IDEM_V_INT(amount),
		                   IDEM_V_TEXT(p.currency),
		                   reason ? IDEM_V_TEXT(reason) : IDEM_V_NULL,
		                   IDEM_V_TEXT(c->fp),
		                   IDEM_V_INT(now)};

		rc = idem_txn_exec(txn,
		                   "INSERT INTO refunds (id, merchant_id, refund_request_no,"
		                   " payment_id, amount, currency, reason, status, fingerprint,"
		                   " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'succeeded', ?, ?)",
		                   v, 9, NULL);
	}
	if (rc < 0)
		goto done;
	{
		idem_value v[5] = {IDEM_V_INT(amount), IDEM_V_INT(amount), IDEM_V_INT(now),
		                   IDEM_V_TEXT(p.id), IDEM_V_INT(amount)};

		rc =
		    idem_txn_exec(txn,
		                  "UPDATE payments SET refunded_amount = refunded_amount + ?,"
		                  " status = CASE WHEN refunded_amount + ? = amount THEN 'refunded'"
		                  " ELSE 'partially_refunded' END, updated_at = ?"
		                  " WHERE id = ? AND status IN ('succeeded', 'partially_refunded')"
		                  " AND refunded_amount + ? <= amount",
		                  v, 5, &changed);
	}
	if (rc == 0 && changed != 1)
		rc = idem__error(IDEM_ERETRY, "payment changed during refund");
	if (rc < 0 || (rc = pay__post(txn, merchant, p.currency, -amount, "refund", r.id, now)) < 0)
		goto done;
	{
		char id[IDEM_PAY_ID_SIZE];

		memcpy(id, r.id, sizeof(id)); /* load clears r */
		if ((rc = load_refund(txn, &r, REFUND_COLS "WHERE id = ? AND merchant_id = ?", id,
		                      merchant)) < 0)
			goto done;
	}
	rc = answer_row(resp, 201, &r);
done:
	pay__payment_clear(&p);
	return rc;
}

static const pay__field refund_fields[] = {
    {"refund_request_no", F_STRING, 0},
    {"payment_id", F_STRING, 1},
    {"amount", F_INT, 1},
    {"reason", F_STRING, 0},
};

void idem_pay_refund_async(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                           void *done_ctx)
{
	pay__op *c = pay__op_new(pay, rq, done, done_ctx);
	const char *no, *payment_id, *reason;
	idem_result *out;
	int rc;

	if (!c)
		return;
	out = &c->res;
	if ((rc = pay__parse_request(&c->doc, out, rq, refund_fields,
	                             sizeof(refund_fields) / sizeof(refund_fields[0]))) < 0 ||
	    !c->doc) {
		pay__finish(c, rc);
		return;
	}
	no = pay__str(c->doc, "refund_request_no");
	payment_id = pay__str(c->doc, "payment_id");
	reason = pay__str(c->doc, "reason");
	if (!no && !rq->key)
		rc = pay__reject(out, 400, "missing_idempotency_key",
		                 "send an Idempotency-Key header or a refund_request_no");
	else if (!no || idem_natural_key_validate(no, strlen(no)) < 0)
		rc = pay__reject(out, 400, "invalid_request",
		                 "'refund_request_no' must be 1..64 of A-Z a-z 0-9 _ - .");
	else if (idem_natural_key_validate(payment_id, strlen(payment_id)) < 0)
		rc = pay__reject(out, 400, "invalid_request", "'payment_id' is malformed");
	else if (!pay__valid_amount(pay__int(c->doc, "amount")))
		rc = pay__reject(out, 400, "invalid_request",
		                 "'amount' must be an integer from 1 to 10^15 minor units");
	else if (reason && strlen(reason) > 255)
		rc = pay__reject(out, 400, "invalid_request", "'reason' must be at most 255 bytes");
	else if ((rc = pay__fingerprint(c->fp, rq, c->doc)) ==
	         0) {
		pay__start(c, "refund", no, pay->opts.ttl_ms, refund_work, NULL, 1);
		return;
	}
	pay__finish(c, rc);
}

int idem_pay_refund(idem_result *out, idem_pay *pay, const idem_pay_request *rq)
{
	return pay__wait(out, pay, rq, idem_pay_refund_async);
}
