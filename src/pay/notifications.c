/*
 * pay/notifications.c: channel callbacks. The first valid SUCCESS moves a
 * payment processing -> succeeded and credits the merchant, exactly once:
 * the claim on (channel, notification, notify_id) stops a repeated
 * delivery, the conditional UPDATE (status must still be 'processing') stops
 * a second notify_id for the same payment, and the ledger's unique
 * (kind, ref_id, merchant_id) stops a second credit if both were bypassed.
 */
#include <string.h>

#include "pay/payment.h"
#include "util/error.h"

static int acknowledge(idem_response *resp)
{
	static const char ok[] = "{\"result\":\"success\"}";

	return idem_response_set(resp, 200, ok, sizeof(ok) - 1);
}

static int notify_work(idem_txn *txn, void *vctx, idem_response *resp)
{
	pay__op *c = vctx;
	json_t *d = c->doc;
	const char *status = pay__str(d, "status");
	int success = strcmp(status, "SUCCESS") == 0;
	int64_t now = pay__now(c->pay), changed = 0;
	pay__payment p = {0};
	int rc, open_ = 0;

	if ((rc = pay__payment_load(c->pay, txn, &p, NULL, pay__str(d, "payment_id"))) < 0)
		goto done;
	if (!p.found || strcmp(p.channel, c->rq->caller) != 0) {
		resp->persist = 0;
		rc = pay__problem(resp, 404, "not_found", "no such payment on this channel");
		goto done;
	}
	if (pay__int(d, "amount") != p.amount) {
		rc = pay__problem(resp, 422, "amount_mismatch",
		                  "the notified amount differs from the payment's");
		goto done;
	}
	/* 'creating': the create call has not returned yet (a channel may notify
	 * before it answers); the notification decides all the same. */
	open_ = strcmp(p.status, "processing") == 0 || strcmp(p.status, "creating") == 0;
	if (success && open_) {
		/* A credit to come: take the merchant's lock first (the order refunds
		 * use too) and refuse one that would overflow before writing anything. */
		int fits = 0;

		if ((rc = pay__lock_merchant(txn, p.merchant_id, now)) < 0 ||
		    (rc = pay__credit_fits(txn, p.merchant_id, p.currency, p.amount, &fits)) < 0)
			goto done;
		if (!fits) {
			rc = pay__overflow_problem(resp);
			goto done;
		}
	}
	{
		idem_value v[7] = {IDEM_V_TEXT(c->rq->caller),
		                   IDEM_V_TEXT(pay__str(d, "notify_id")),
		                   IDEM_V_TEXT(p.id),
		                   IDEM_V_TEXT(pay__str(d, "channel_txn_id")),
		                   IDEM_V_TEXT(status),
		                   IDEM_V_INT(p.amount),
		                   IDEM_V_INT(now)};

		rc = idem_txn_try_exec(txn,
		                   "INSERT INTO notifications (channel, notify_id, payment_id,"
		                   " channel_txn_id, status, amount, created_at)"
		                   " VALUES (?, ?, ?, ?, ?, ?, ?)",
		                   v, 7, NULL);
	}
	if (rc == IDEM_ECONFLICT) {
		/* Delivered before under another idempotency key: already handled. */
		rc = acknowledge(resp);
		goto done;
	}
	if (rc < 0)
		goto done;
	{
		idem_value v[4] = {IDEM_V_TEXT(success ? "succeeded" : "failed"),
		                   IDEM_V_TEXT(pay__str(d, "channel_txn_id")), IDEM_V_INT(now),
		                   IDEM_V_TEXT(p.id)};

		rc = idem_txn_exec(
		    txn,
		    "UPDATE payments SET status = ?, channel_txn_id = ?, updated_at = ?"
		    " WHERE id = ? AND status IN ('creating', 'processing')",
		    v, 4, &changed);
	}
	if (rc < 0)
		goto done;
	/* changed == 0: the payment is final already; acknowledge, change nothing. */
	if (changed == 1 && success) {
		/* Locked above unless the payment was final when read (it is not now):
		 * taking the lock again is harmless. */
		if ((!open_ &&
		     (rc = pay__lock_merchant(txn, p.merchant_id, now)) < 0) ||
		    (rc = pay__post(txn, p.merchant_id, p.currency, p.amount, "payment", p.id,
		                    now)) < 0)
			goto done;
	}
	rc = acknowledge(resp);
done:
	pay__payment_clear(&p);
	return rc;
}

static const pay__field notify_fields[] = {
    {"notify_id", F_STRING, 0, V_NATURAL_KEY, 1},  {"channel_txn_id", F_STRING, 1, V_NATURAL_KEY, 0},
    {"payment_id", F_STRING, 1, V_ID, 0},          {"status", F_STRING, 1, V_NOTIFY_STATUS, 0},
    {"amount", F_INT, 1, V_AMOUNT, 0},
};

void idem_pay_notify_async(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                           void *done_ctx)
{
	pay__op *c;
	const char *notify_id;
	idem_result *out;
	int rc;

	/* The payment id names its shard: the notification goes there alone. */
	pay = pay__route_notify(pay, rq);
	if (!(c = pay__op_new(pay, rq, done, done_ctx)))
		return;
	out = &c->res;
	if ((rc = pay__parse_request(&c->doc, out, rq, notify_fields,
	                             sizeof(notify_fields) / sizeof(notify_fields[0]))) < 0 ||
	    !c->doc) {
		pay__finish(c, rc);
		return;
	}
	notify_id = pay__str(c->doc, "notify_id");
	if ((rc = pay__fingerprint(c->fp, rq, c->doc)) == 0) {
		pay__start(c, "notification", notify_id, pay->opts.notification_ttl_ms, notify_work,
		           NULL, 0);
		return;
	}
	pay__finish(c, rc);
}

int idem_pay_notify(idem_result *out, idem_pay *pay, const idem_pay_request *rq)
{
	return pay__wait(out, pay, rq, idem_pay_notify_async);
}
