/*
 * pay/answer.c: JSON answers and problem+json bodies. Bodies are serialised
 * compactly, members in insertion order, so the same state always gives the
 * same bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "pay/internal.h"
#include "util/error.h"

int pay__json(idem_response *resp, int status, json_t *obj)
{
	char *text = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
	int rc;

	if (!text)
		return idem__error(IDEM_ENOMEM, "cannot serialise answer");
	rc = idem_response_set(resp, status, text, strlen(text));
	free(text);
	return rc;
}

static const char *title_of(const char *code)
{
	static const struct {
		const char *code, *title;
	} titles[] = {
	    {"invalid_json", "Malformed JSON"},
	    {"invalid_request", "Invalid request"},
	    {"missing_idempotency_key", "Idempotency key missing"},
	    {"invalid_idempotency_key", "Invalid idempotency key"},
	    {"unauthorized", "Unauthorized"},
	    {"invalid_signature", "Invalid signature"},
	    {"not_found", "Not found"},
	    {"unknown_merchant", "Unknown merchant"},
	    {"method_not_allowed", "Method not allowed"},
	    {"request_in_progress", "Request in progress"},
	    {"business_key_conflict", "Business key conflict"},
	    {"payment_not_refundable", "Payment not refundable"},
	    {"refund_exceeds_payment", "Refund exceeds payment"},
	    {"insufficient_balance", "Insufficient balance"},
	    {"balance_overflow", "Balance overflow"},
	    {"payload_too_large", "Payload too large"},
	    {"unsupported_media_type", "Unsupported media type"},
	    {"idempotency_key_reused", "Idempotency key reused"},
	    {"amount_mismatch", "Amount mismatch"},
	    {"store_unavailable", "Store unavailable"},
	    {"internal_error", "Internal error"},
	};

	for (size_t i = 0; i < sizeof(titles) / sizeof(titles[0]); i++)
		if (strcmp(titles[i].code, code) == 0)
			return titles[i].title;
	return "Error";
}

int idem_pay_problem(char **out, size_t *len, int status, const char *code, const char *detail,
                     const char *extra_name, const char *extra_value)
{
	char type[96];
	json_t *obj;
	int rc = 0;

	IDEM__ASSERT_ARG(out);
	IDEM__ASSERT_ARG(len);
	*out = NULL;
	*len = 0;
	IDEM__ASSERT_ARG(code);
	snprintf(type, sizeof(type), "/problems/");
	/* The type path uses dashes: /problems/idempotency-key-reused. */
	for (size_t i = 0, n = strlen(type); code[i] && n + 1 < sizeof(type); i++, n++) {
		type[n] = code[i] == '_' ? '-' : code[i];
		type[n + 1] = '\0';
	}
	obj = json_pack("{s:s, s:s, s:i, s:s, s:s}", "type", type, "title", title_of(code),
	                "status", status, "code", code, "detail", detail ? detail : "");
	if (obj && extra_name && extra_value &&
	    json_object_set_new(obj, extra_name, json_string(extra_value)) < 0) {
		json_decref(obj);
		obj = NULL;
	}
	if (!obj || !(*out = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER)))
		rc = idem__error(IDEM_ENOMEM, "cannot build problem body");
	else
		*len = strlen(*out);
	json_decref(obj);
	return rc;
}

int pay__problem(idem_response *resp, int status, const char *code, const char *detail)
{
	char *body = NULL;
	size_t len = 0;
	int rc = idem_pay_problem(&body, &len, status, code, detail, NULL, NULL);

	if (rc == 0)
		rc = idem_response_set(resp, status, body, len);
	free(body);
	return rc;
}

int pay__read_answer(idem_result *out, json_t *obj)
{
	idem_response r = {0, NULL, 0, 0};
	int rc;

	if (!obj)
		return idem__error(IDEM_ENOMEM, "out of memory");
	rc = pay__json(&r, 200, obj);
	json_decref(obj);
	if (rc < 0)
		return rc;
	out->outcome = IDEM_FIRST;
	out->http_status = 200;
	out->body = r.body;
	out->body_len = r.body_len;
	return 0;
}

int pay__async_args(const char *func, const idem_pay *pay, const idem_pay_request *rq,
                    idem_done_fn done, void *done_ctx)
{
	const char *missing = !pay ? "pay" : !rq ? "rq" : !done ? "done" : NULL;
	idem_result none = {0};
	int rc;

	if (!missing)
		return 1;
	rc = idem__error_arg(func, missing);
	if (done)
		done(done_ctx, rc, &none);
	return 0;
}

int pay__reject(idem_result *out, int status, const char *code, const char *detail)
{
	char *body = NULL;
	size_t len = 0;
	int rc = idem_pay_problem(&body, &len, status, code, detail, NULL, NULL);

	if (rc < 0)
		return rc;
	idem_result_clear(out);
	out->outcome = IDEM_FIRST;
	out->http_status = status;
	out->body = (unsigned char *)body;
	out->body_len = len;
	out->stored = 0;
	return 0;
}
