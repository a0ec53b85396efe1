/*
 * pay/pipeline.c: the path every write takes once its body is valid:
 * fingerprint, key (header or natural), claim, and the work, atomically
 * (queued for group commit, answered after the COMMIT) or in two phases.
 * Duplicates get their answers here; errors stay errors.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cache.h"
#include "core/claim_internal.h"
#include "pay/channel.h"
#include "pay/internal.h"
#include "util/error.h"
#include "util/waiter.h"

/*
 * The replay shortcut. A retry usually resends the very bytes of the first
 * request, and those bytes give the very fingerprint they gave then: the
 * fingerprint is a function of the method, path and body alone. So the
 * request's raw bytes are kept beside the cached answer once the canonical
 * path has shown which fingerprint they give (note_raw, after the answer),
 * and a later request with exactly those bytes under the same key is that
 * replay, answered without parsing, canonicalising or hashing the body. Any
 * other body, equal or not once canonical, goes the full way, so the
 * canonical fingerprint still decides every MISMATCH (422). Only for routes
 * whose business type and key follow from the request alone (raw_type), and
 * bodies that fit IDEM__CACHE_RAW_MAX. The ops come only from pay__op_new,
 * so the wrapper below is every op's real allocation and pay__finish's
 * free(op) frees it (op is its first member).
 */
typedef struct {
	pay__op op;
	const char *raw_type; /* NULL: no shortcut for this request */
} raw_op;

static const char *raw_type(const idem_pay_request *rq)
{
	if (!rq->key || rq->key_invalid || !rq->method || !rq->path || !rq->body ||
	    strcmp(rq->method, "POST") != 0)
		return NULL;
	if (strcmp(rq->path, "/v1/payments") == 0)
		return "payment";
	if (strcmp(rq->path, "/v1/refunds") == 0)
		return "refund";
	return NULL;
}

/* rq's bytes as the cache compares them: "METHOD PATH\n" then the body; 0: too long. */
static size_t raw_bytes(char out[IDEM__CACHE_RAW_MAX], const idem_pay_request *rq)
{
	size_t m = strlen(rq->method), p = strlen(rq->path);

	if (m + p + 2 + rq->body_len > IDEM__CACHE_RAW_MAX)
		return 0;
	memcpy(out, rq->method, m);
	out[m] = ' ';
	memcpy(out + m + 1, rq->path, p);
	out[m + 1 + p] = '\n';
	memcpy(out + m + p + 2, rq->body, rq->body_len);
	return m + p + 2 + rq->body_len;
}

/*
 * 1 and out a REPLAY when pay's front cache holds rq's exact bytes under its
 * key; else 0 with out empty (go the canonical way). *type: the business
 * type of the shortcut, NULL when rq cannot take it. Memory only.
 */
static int raw_lookup(idem_result *out, idem_pay *pay, const idem_pay_request *rq,
                      const char **type)
{
	idem_request req = IDEM_REQUEST_INIT;
	char raw[IDEM__CACHE_RAW_MAX];
	size_t n;

	memset(out, 0, sizeof(*out));
	if (!(*type = raw_type(rq)) || !(n = raw_bytes(raw, rq))) {
		*type = NULL;
		return 0;
	}
	req.scope = rq->caller;
	req.business_type = *type;
	req.key = rq->key;
	req.key_len = rq->key_len;
	if (idem__replay_raw(pay->store, &req, raw, n, out) != 1) {
		idem_result_clear(out);
		return 0;
	}
	return 1;
}

/* 1 when done has been given the replay; 0 to go the canonical way. */
static int raw_replay(raw_op *r)
{
	idem_result res = {0};

	if (!raw_lookup(&res, r->op.pay, r->op.rq, &r->raw_type))
		return 0;
	r->op.done(r->op.done_ctx, 0, &res);
	idem_result_clear(&res);
	return 1;
}

/*
 * The shortcut alone, for a caller that must not wait (an HTTP event
 * thread): a router answers nothing here, since finding a merchant's shard
 * may read the directory.
 */
int idem_pay_try_replay(idem_result *out, idem_pay *pay, const idem_pay_request *rq)
{
	const char *type = NULL;

	IDEM__ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(rq);
	if (pay->nshards)
		return 0;
	return raw_lookup(out, pay, rq, &type);
}

/* After the canonical path answered from a stored record: keep the bytes. */
static void note_raw(raw_op *r, const idem_result *res)
{
	const pay__op *op = &r->op;
	char raw[IDEM__CACHE_RAW_MAX];
	size_t n;

	if (!r->raw_type ||
	    !(res->outcome == IDEM_REPLAY || (res->outcome == IDEM_FIRST && res->stored)))
		return;
	if (!op->req.business_type || strcmp(op->req.business_type, r->raw_type) != 0 ||
	    op->req.key != op->rq->key || op->req.fingerprint != op->fp)
		return;
	if ((n = raw_bytes(raw, op->rq)))
		idem__replay_note_raw(op->pay->store, &op->req, raw, n);
}

pay__op *pay__op_new(idem_pay *pay, const idem_pay_request *rq, idem_done_fn done, void *done_ctx)
{
	raw_op *r = calloc(1, sizeof(*r));
	pay__op *op = r ? &r->op : NULL;

	if (!op) {
		idem_result none = {0};

		done(done_ctx, idem__error(IDEM_ENOMEM, "out of memory"), &none);
		return NULL;
	}
	op->pay = pay;
	op->rq_copy = *rq;
	op->rq = &op->rq_copy;
	op->done = done;
	op->done_ctx = done_ctx;
	if (raw_replay(r)) { /* answered: the caller returns as after ENOMEM */
		free(r);
		return NULL;
	}
	return op;
}

static void op_free(pay__op *op)
{
	if (op->prep_free)
		op->prep_free(op->prep);
	idem_result_clear(&op->res);
	json_decref(op->doc);
	free(op);
}

int pay__op_drop(pay__op *op)
{
	op_free(op);
	return IDEM_EWOULDBLOCK;
}

void pay__finish(pay__op *op, int rc)
{
	if (rc > 0)
		rc = 0;
	op->done(op->done_ctx, rc, &op->res);
	op_free(op);
}

/* Give duplicates their problem bodies; mark backstop replays. */
static int dress(pay__op *op, idem_result *out)
{
	idem_response r = {0, NULL, 0, 0};
	int rc = 0;

	if (out->outcome == IDEM_MISMATCH)
		rc = pay__problem(&r, 422, "idempotency_key_reused",
		                  "this idempotency key was used with a different request");
	else if (out->outcome == IDEM_IN_PROGRESS)
		rc = pay__problem(&r, 409, "request_in_progress",
		                  "a request with this idempotency key is still being processed");
	if (r.body) {
		free(out->body);
		out->http_status = r.http_status;
		out->body = r.body;
		out->body_len = r.body_len;
	}
	/*
	 * The business backstop (API.md): a request new under its key whose
	 * natural key exists is a replay of that resource. Creates answer 201,
	 * so a stored 200 from one of them is only ever this.
	 */
	if (op->backstop && out->outcome == IDEM_FIRST && out->stored && out->http_status == 200)
		out->outcome = IDEM_REPLAY;
	return rc;
}

static void on_done(void *ctx, int rc, idem_result *res)
{
	pay__op *op = ctx;

	if (rc == 0)
		rc = dress(op, res);
	if (rc == 0)
		note_raw((raw_op *)op, res);
	idem_result_clear(&op->res);
	op->res = *res;
	memset(res, 0, sizeof(*res));
	pay__finish(op, rc);
}

void pay__op_done(pay__op *op, int rc, idem_result *res)
{
	on_done(op, rc, res);
}

void pay__after_channel(idem_pay *pay)
{
	idem_deadline_begin(pay->store);
}

static void two_phase_done(idem_pay *pay)
{
	pthread_mutex_lock(&pay->channels_lock);
	if (--pay->two_phase == 0)
		pthread_cond_broadcast(&pay->idle);
	pthread_mutex_unlock(&pay->channels_lock);
}

static void *two_phase_main(void *arg)
{
	pay__op *op = arg;
	idem_pay *pay = op->pay;
	idem_claim *claim = NULL;
	idem_result res = {0};
	int rc;

	if ((rc = idem_claim_begin(&claim, &res, op->pay->store, &op->req)) == 0 && claim) {
		idem_result_clear(&res);
		op->before_work(op->pay);
		pay__after_channel(op->pay);
		rc = idem_claim_finish(&res, claim, op->work, op);
		if (rc < 0 && rc != IDEM_ELEASE)
			idem_claim_abort(claim); /* best effort; else the lease runs out */
		if (rc == IDEM_ELEASE) /* someone took over and will answer: ask to retry */
			rc = idem__error(IDEM_ERETRY, "lease lost while calling the channel");
		idem_claim_free(claim);
	}
	on_done(op, rc, &res); /* frees op */
	idem_result_clear(&res);
	two_phase_done(pay);
	return NULL;
}

typedef struct {
	pay__job job;
	pay__op *op;
} op_job;

static void op_job_run(pay__job *job, CURL *h)
{
	op_job *j = (op_job *)job;
	pay__op *op = j->op;

	(void)h;
	free(j);
	two_phase_main(op);
}

void pay__op_request(pay__op *op, const char *type, const char *natural, int64_t ttl_ms,
                     int backstop)
{
	const idem_pay_request *rq = op->rq;

	op->backstop = backstop;
	op->req = (idem_request)IDEM_REQUEST_INIT;
	op->req.scope = rq->caller;
	op->req.business_type = type;
	op->req.key = rq->key ? rq->key : natural;
	op->req.key_len = rq->key ? rq->key_len : strlen(natural);
	op->req.fingerprint = op->fp;
	op->req.ttl_ms = ttl_ms;
}

void pay__start(pay__op *op, const char *type, const char *natural, int64_t ttl_ms,
                idem_work_fn work, void (*before_work)(idem_pay *pay), int backstop)
{
	pay__op_request(op, type, natural, ttl_ms, backstop);
	if (!before_work) {
		idem_execute_async(op->pay->store, &op->req, work, op, on_done, op);
		return;
	}
	/*
	 * Two phases: the claim commits PROCESSING, the channel is called with no
	 * transaction open, and the work lands with the completion. The channel
	 * may take seconds, so this runs on the channel pool (chanpool.c):
	 * blocking the caller's thread (an HTTP server thread) would stall every
	 * other connection it serves, and a thread per request has no bound.
	 */
	op->work = work;
	op->before_work = before_work;
	{
		pay__pool *pool = pay__pool_get(op->pay);
		op_job *j = pool ? calloc(1, sizeof(*j)) : NULL;

		if (!j) {
			pay__finish(op,
			            idem__error(IDEM_ENOMEM, "cannot start a two-phase request"));
			return;
		}
		j->job.run = op_job_run;
		j->op = op;
		pthread_mutex_lock(&op->pay->channels_lock);
		op->pay->two_phase++;
		pthread_mutex_unlock(&op->pay->channels_lock);
		if (pay__pool_submit(pool, &j->job) == 0)
			return;
		free(j);
		two_phase_done(op->pay);
		pay__reject(&op->res, 503, "channel_busy",
		            "too many channel calls are waiting; retry later");
		pay__finish(op, 0);
	}
}

int pay__start_nowait(pay__op *op, const char *type, const char *natural, int64_t ttl_ms,
                      idem_work_fn work, int backstop)
{
	pay__op_request(op, type, natural, ttl_ms, backstop);
	if (idem_execute_async_nowait(op->pay->store, &op->req, work, op, on_done, op) ==
	    IDEM_EWOULDBLOCK)
		return pay__op_drop(op);
	return 0;
}

int pay__wait(idem_result *out, idem_pay *pay, const idem_pay_request *rq, pay__async_fn fn)
{
	idem__waiter w;

	memset(out, 0, sizeof(*out));
	idem__waiter_init(&w);
	fn(pay, rq, idem__waiter_done, &w);
	return idem__waiter_wait(&w, out);
}
