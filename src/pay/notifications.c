/*
 * pay/notifications.c: channel callbacks. The first valid SUCCESS moves a
 * payment processing -> succeeded and credits the merchant, exactly once:
 * the claim on (channel, notification, notify_id) stops a repeated
 * delivery, the conditional UPDATE (status must still be 'processing') stops
 * a second notify_id for the same payment, and the ledger's unique
 * (kind, ref_id, merchant_id) stops a second credit if both were bypassed.
 */
#include <string.h>

#include "pay/channel.h"
#include "pay/payment.h"
#include "util/error.h"

static int acknowledge(idem_response *resp)
{
	static const char ok[] = "{\"result\":\"success\"}";

	return idem_response_set(resp, 200, ok, sizeof(ok) - 1);
}

/*
 * A credit to come: take the merchant's lock first (the order refunds use
 * too) and answer 409 for one that would overflow, before anything is
 * written. 1 when answered so.
 */
static int refuse_overflow(idem_txn *txn, const pay__payment *p, int64_t now, idem_response *resp)
{
	int fits = 0, rc;

	if ((rc = pay__lock_merchant(txn, p->merchant_id, now)) < 0 ||
	    (rc = pay__credit_fits(txn, p->merchant_id, p->currency, p->amount, &fits)) < 0)
		return rc;
	if (fits)
		return 0;
	rc = pay__overflow_problem(resp);
	return rc < 0 ? rc : 1;
}

/* The delivery's row: IDEM_ECONFLICT when (channel, notify_id) came before. */
static int insert_notification(idem_txn *txn, const pay__op *c, const pay__payment *p, int64_t now)
{
	idem_value v[7] = {IDEM_V_TEXT(c->rq->caller),
	                   IDEM_V_TEXT(pay__str(c->doc, "notify_id")),
	                   IDEM_V_TEXT(p->id),
	                   IDEM_V_TEXT(pay__str(c->doc, "channel_txn_id")),
	                   IDEM_V_TEXT(pay__str(c->doc, "status")),
	                   IDEM_V_INT(p->amount),
	                   IDEM_V_INT(now)};

	return idem_txn_try_exec(txn,
	                         "INSERT INTO notifications (channel, notify_id, payment_id,"
	                         " channel_txn_id, status, amount, created_at)"
	                         " VALUES (?, ?, ?, ?, ?, ?, ?)",
	                         v, 7, NULL);
}

static int notify_work(idem_txn *txn, void *vctx, idem_response *resp)
{
	pay__op *c = vctx;
	json_t *d = c->doc;
	const char *status = pay__str(d, "status");
	int64_t now = pay__now(c->pay);
	pay__payment p = {0};
	int rc, changed = 0;

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
	if (strcmp(status, "SUCCESS") == 0 &&
	    (strcmp(p.status, "processing") == 0 || strcmp(p.status, "creating") == 0) &&
	    (rc = refuse_overflow(txn, &p, now, resp)) != 0)
		goto done;
	if ((rc = insert_notification(txn, c, &p, now)) == IDEM_ECONFLICT) {
		/* Delivered before under another idempotency key: already handled. */
		rc = acknowledge(resp);
		goto done;
	}
	/* The payment's state and its credit, as a channel's answer sets them
	 * (chanpay.c); a payment final already is left as it is. */
	if (rc < 0 || (rc = pay__apply_order_status(c->pay, txn, p.id, status,
	                                            pay__str(d, "channel_txn_id"), &changed)) < 0)
		goto done;
	rc = acknowledge(resp);
done:
	pay__payment_clear(&p);
	return rc > 0 ? 0 : rc;
}

static const pay__field notify_fields[] = {
    {"notify_id", F_STRING, 0, V_NATURAL_KEY, 1},
    {"channel_txn_id", F_STRING, 1, V_NATURAL_KEY, 0},
    {"payment_id", F_STRING, 1, V_ID, 0},
    {"status", F_STRING, 1, V_NOTIFY_STATUS, 0},
    {"amount", F_INT, 1, V_AMOUNT, 0},
};

void idem_pay_notify_async(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                           void *done_ctx)
{
	pay__op *c;
	const char *notify_id;
	idem_result *out;
	int rc;

	if (!pay__async_args(__func__, pay, rq, done, done_ctx))
		return;
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
	IDEM__ASSERT_ARG(out); /* pay and rq: the async call answers them */
	return pay__wait(out, pay, rq, idem_pay_notify_async);
}
