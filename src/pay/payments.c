/*
 * pay/payments.c: creating and reading payments. A payment is created in
 * status "processing"; only a channel notification moves it on. Creating one
 * is one unit with its idempotency claim; when the mock channel is set to
 * answer slowly, it runs in two phases (claim committed, channel called,
 * payment written with the completion) so duplicates meanwhile see 409.
 */
#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

#include "pay/channel.h"
#include "pay/payment.h"
#include "util/clock.h"
#include "util/error.h"

/* The order number exists under another idempotency key: the backstop. */
static int order_exists(idem_txn *txn, pay__op *c, idem_response *resp)
{
	pay__payment p = {0};
	json_t *obj = NULL;
	int rc;

	rc = pay__payment_load_by_order(c->pay, txn, &p, c->rq->caller,
	                                pay__str(c->doc, "merchant_order_no"));
	if (rc == 0 && !p.found)
		rc = idem__error(IDEM_ERETRY, "conflicting payment vanished");
	else if (rc == 0 && !(obj = pay__payment_object(&p)))
		rc = idem__error(IDEM_ENOMEM, "out of memory");
	else if (rc == 0)
		rc = pay__backstop(resp, obj, p.id, p.fingerprint, c->fp, "payment");
	json_decref(obj);
	pay__payment_clear(&p);
	return rc;
}

/*
 * A new payment's row and answer, made by the request's thread before its
 * unit is queued (prepare_payment), so the single writer only runs its SQL:
 * the id, the time and the 201 body are fixed here, and a unit run again
 * (its batch retried unit by unit) writes and answers the very same.
 */
typedef struct {
	pay__payment p; /* the row as it will be inserted; p.metadata: compact JSON */
	char *body;     /* the 201 answer */
	size_t len;
} prepared;

static void prepared_free(void *v)
{
	prepared *pp = v;

	if (!pp)
		return;
	pay__payment_clear(&pp->p);
	free(pp->body);
	free(pp);
}

/* 0 with c->prep set, or an error (nothing set). */
static int prepare_payment(pay__op *c)
{
	json_t *d = c->doc, *meta = json_object_get(d, "metadata"), *obj = NULL;
	const char *desc = pay__str(d, "description");
	prepared *pp = calloc(1, sizeof(*pp));
	pay__payment *p = pp ? &pp->p : NULL;
	int rc;

	if (!pp)
		return idem__error(IDEM_ENOMEM, "out of memory");
	if ((rc = pay__new_id(p->id, "pay_", c->pay->shard)) < 0)
		goto fail;
	snprintf(p->merchant_id, sizeof(p->merchant_id), "%s", c->rq->caller);
	snprintf(p->order_no, sizeof(p->order_no), "%s", pay__str(d, "merchant_order_no"));
	p->amount = pay__int(d, "amount");
	snprintf(p->currency, sizeof(p->currency), "%s", pay__str(d, "currency"));
	snprintf(p->channel, sizeof(p->channel), "%s", pay__str(d, "channel"));
	snprintf(p->status, sizeof(p->status), "processing");
	p->created_at = p->updated_at = pay__now(c->pay);
	rc = idem__error(IDEM_ENOMEM, "out of memory");
	if ((meta && !(p->metadata = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS))) ||
	    (desc && !(p->description = strdup(desc))) || !(obj = pay__payment_object(p)) ||
	    !(pp->body = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER)))
		goto fail;
	json_decref(obj);
	pp->len = strlen(pp->body);
	c->prep = pp;
	c->prep_free = prepared_free;
	return 0;
fail:
	json_decref(obj);
	prepared_free(pp);
	return rc;
}

static int create_payment_work(idem_txn *txn, void *vctx, idem_response *resp)
{
	pay__op *c = vctx;
	const prepared *pp = c->prep;
	const pay__payment *p = &pp->p;
	int rc, known = 0;

	if ((rc = pay__channel_exists(c->pay, txn, p->channel, &known)) < 0)
		return rc;
	if (!known) {
		resp->persist = 0; /* a validation error: not stored */
		return pay__problem(resp, 400, "invalid_request",
		                    "'channel' names no known channel");
	}
	{
		idem_value v[11] = {
		    IDEM_V_TEXT(p->id),
		    IDEM_V_TEXT(p->merchant_id),
		    IDEM_V_TEXT(p->order_no),
		    IDEM_V_INT(p->amount),
		    IDEM_V_TEXT(p->currency),
		    IDEM_V_TEXT(p->channel),
		    p->description ? IDEM_V_TEXT(p->description) : IDEM_V_NULL,
		    p->metadata ? IDEM_V_TEXT(p->metadata) : IDEM_V_NULL,
		    IDEM_V_TEXT(c->fp),
		    IDEM_V_INT(p->created_at),
		    IDEM_V_INT(p->updated_at),
		};

		rc = idem_txn_try_exec(
		    txn,
		    "INSERT INTO payments (id, merchant_id, merchant_order_no, amount,"
		    " currency, channel, description, metadata, status, refunded_amount,"
		    " fingerprint, created_at, updated_at)"
		    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'processing', 0, ?, ?, ?)",
		    v, 11, NULL);
	}
	if (rc == IDEM_ECONFLICT)
		return order_exists(txn, c, resp);
	if (rc < 0)
		return rc;
	/* The answer is the row just written, made before: copied, as a rerun
	 * of this unit answers it again. */
	return idem_response_set(resp, 201, pp->body, pp->len);
}

static void call_mock_channel(idem_pay *pay)
{
	/* The test double for a channel's order API: it just takes its time. */
	idem__sleep_us((int64_t)pay->opts.mock_channel_delay_ms * 1000);
}

static const pay__field payment_fields[] = {
    {"merchant_order_no", F_STRING, 0, V_NATURAL_KEY, 1},
    {"amount", F_INT, 1, V_AMOUNT, 0},
    {"currency", F_STRING, 1, V_CURRENCY, 0},
    {"channel", F_STRING, 1, V_CHANNEL, 0},
    {"description", F_STRING, 0, V_TEXT255, 0},
    {"metadata", F_OBJECT, 0, V_ANY, 0},
};

/*
 * A payment, on a thread that may wait (nowait 0: always 0) or must not
 * (1): then IDEM_EWOULDBLOCK, nothing done and done not called, for a
 * router (the shard may be read from the directory), a connected channel
 * (its configuration may be read) and whatever the core refuses to start
 * without waiting (idem_execute_async_nowait).
 */
static int create_payment(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                          void *done_ctx, int nowait)
{
	pay__op *c;
	idem_result *out;
	const char *order_no, *channel;
	void (*before_work)(idem_pay *) = NULL;
	int rc;

	if (!pay__async_args(nowait ? "idem_pay_create_payment_nowait"
	                            : "idem_pay_create_payment_async",
	                     pay, rq, done, done_ctx))
		return 0;
	if (nowait && pay->nshards)
		return IDEM_EWOULDBLOCK;
	if (!(pay = pay__route_async(pay, rq->caller, done, done_ctx)) ||
	    !(c = pay__op_new(pay, rq, done, done_ctx)))
		return 0;
	out = &c->res;
	if ((rc = pay__parse_request(&c->doc, out, rq, payment_fields,
	                             sizeof(payment_fields) / sizeof(payment_fields[0]))) < 0 ||
	    !c->doc || (rc = pay__fingerprint(c->fp, rq, c->doc)) < 0) {
		pay__finish(c, rc);
		return 0;
	}
	order_no = pay__str(c->doc, "merchant_order_no");
	channel = pay__str(c->doc, "channel");
	if (strcmp(channel, "mock") != 0) {
		pay__chan ch;
		int found = 0;

		/* Without waiting: only a channel known, from memory, to have no
		 * connection (the atomic path); the rest goes to a thread that may wait. */
		if (nowait && (!pay__chan_get_cached(pay, channel, &ch, &found) ||
		               (found && ch.base_url[0]))) {
			OPENSSL_cleanse(&ch, sizeof(ch));
			return pay__op_drop(c);
		}
		/* A connected channel: two phases, the call on the channel pool. */
		if (!nowait && (rc = pay__chan_get(pay, channel, &ch, &found)) == 0 && found &&
		    ch.base_url[0]) {
			pay__chan_payment_start(c, &ch);
			OPENSSL_cleanse(&ch, sizeof(ch));
			return 0;
		}
		OPENSSL_cleanse(&ch, sizeof(ch));
		if (rc < 0) {
			pay__finish(c, rc);
			return 0;
		}
	} else if (pay->opts.mock_channel_delay_ms > 0) {
		before_work = call_mock_channel;
	}
	if ((rc = prepare_payment(c)) < 0) {
		pay__finish(c, rc);
		return 0;
	}
	if (nowait && !before_work)
		return pay__start_nowait(c, "payment", order_no, pay->opts.ttl_ms,
		                         create_payment_work, 1);
	pay__start(c, "payment", order_no, pay->opts.ttl_ms, create_payment_work, before_work, 1);
	return 0;
}

void idem_pay_create_payment_async(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                                   void *done_ctx)
{
	create_payment(pay, rq, done, done_ctx, 0);
}

int idem_pay_create_payment_nowait(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done,
                                   void *done_ctx)
{
	return create_payment(pay, rq, done, done_ctx, 1);
}

int idem_pay_create_payment(idem_result *out, idem_pay *pay, const idem_pay_request *rq)
{
	IDEM__ASSERT_ARG(out); /* pay and rq: the async call answers them */
	return pay__wait(out, pay, rq, idem_pay_create_payment_async);
}

static int answer_payment(idem_result *out, pay__payment *p)
{
	if (!p->found)
		return pay__reject(out, 404, "not_found", "no such payment");
	return pay__read_answer(out, pay__payment_object(p));
}

int idem_pay_get_payment(idem_result *out, idem_pay *pay, const char *merchant, const char *id)
{
	pay__payment p = {0};
	int rc;

	IDEM__ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(merchant);
	IDEM__ASSERT_ARG(id);
	if ((rc = pay__route(pay, merchant, &pay)) < 0)
		return rc;
	if ((rc = pay__payment_load(pay, NULL, &p, merchant, id)) == 0)
		rc = answer_payment(out, &p);
	pay__payment_clear(&p);
	return rc;
}

int idem_pay_find_payment(idem_result *out, idem_pay *pay, const char *merchant,
                          const char *merchant_order_no)
{
	pay__payment p = {0};
	int rc;

	IDEM__ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(merchant);
	IDEM__ASSERT_ARG(merchant_order_no);
	if (idem_natural_key_validate(merchant_order_no, strlen(merchant_order_no)) < 0)
		return pay__reject(out, 400, "invalid_request",
		                   "'merchant_order_no' must be 1..64 of A-Z a-z 0-9 _ - .");
	if ((rc = pay__route(pay, merchant, &pay)) < 0)
		return rc;
	if ((rc = pay__payment_load_by_order(pay, NULL, &p, merchant, merchant_order_no)) == 0)
		rc = answer_payment(out, &p);
	pay__payment_clear(&p);
	return rc;
}
