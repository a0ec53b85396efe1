/*
 * pay/pipeline.c: the path every write takes once its body is valid:
 * fingerprint, key (header or natural), claim, and the work, atomically or
 * in two phases. Duplicates get their answers here; errors stay errors.
 */
#include <string.h>

#include "pay/internal.h"
#include "util/error.h"

void pay__mark_backstop(idem_result *out)
{
	if (out->outcome == IDEM_FIRST && out->stored && out->http_status == 200)
		out->outcome = IDEM_REPLAY;
}

int pay__run(idem_result *out, idem_pay *pay, const idem_pay_request *rq, const char *type,
	     const char *natural, int64_t ttl_ms, idem_work_fn work, void *ctx,
	     void (*before_work)(idem_pay *pay))
{
	idem_request req = IDEM_REQUEST_INIT;
	idem_claim *claim = NULL;
	char fp[IDEM_FINGERPRINT_LEN + 1];
	int rc;

	if ((rc = idem_fingerprint(fp, rq->method, rq->path, rq->body, rq->body_len)) < 0)
		return rc;
	req.scope = rq->caller;
	req.business_type = type;
	req.key = rq->key ? rq->key : natural;
	req.key_len = rq->key ? rq->key_len : strlen(natural);
	req.fingerprint = fp;
	req.ttl_ms = ttl_ms;

	if (!before_work) {
		rc = idem_execute(out, pay->store, &req, work, ctx);
	} else if ((rc = idem_claim_begin(&claim, out, pay->store, &req)) == 0 && claim) {
		before_work(pay);
		rc = idem_claim_finish(out, claim, work, ctx);
		if (rc < 0 && rc != IDEM_ELEASE)
			idem_claim_abort(claim); /* best effort; else the lease runs out */
		if (rc == IDEM_ELEASE) /* someone took over: they answer; ask to retry */
			rc = idem__error(IDEM_ERETRY, "lease lost while calling the channel");
		idem_claim_free(claim);
	}
	if (rc < 0)
		return rc;
	if (out->outcome == IDEM_MISMATCH) {
		idem_response r = {0, NULL, 0, 0};

		rc = pay__problem(&r, 422, "idempotency_key_reused",
				  "this idempotency key was used with a different request");
		out->http_status = r.http_status;
		out->body = r.body;
		out->body_len = r.body_len;
	} else if (out->outcome == IDEM_IN_PROGRESS) {
		idem_response r = {0, NULL, 0, 0};

		rc = pay__problem(&r, 409, "request_in_progress",
				  "a request with this idempotency key is still being processed");
		out->http_status = r.http_status;
		out->body = r.body;
		out->body_len = r.body_len;
	}
	return rc;
}
