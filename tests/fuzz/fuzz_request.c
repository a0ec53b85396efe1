/*
 * tests/fuzz/fuzz_request.c: request JSON through the real write paths
 * (payment, refund, transfer, notification) on a SQLite store: strict
 * parsing and validation (src/pay/input.c, payments.c, refunds.c,
 * transfers.c, notifications.c). Byte 0 picks the operation, byte 1 the
 * Idempotency-Key (none, one of three, or malformed); the rest is the body
 * (@PAY@, @M2@, @CH@ are replaced by this run's ids). Each answer must be a
 * well-formed result: a JSON body, a 2xx only as FIRST or REPLAY, a retry
 * with the same key and body replays it byte for byte.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_env.h"

typedef int (*write_fn)(idem_result *, idem_pay *, const idem_pay_request *);

static void check(const idem_result *res)
{
	json_t *doc;

	if (res->http_status < 200 || res->http_status > 599)
		fuzz_fail("status out of range");
	if (!res->body || res->body_len == 0)
		fuzz_fail("answer without a body");
	if (!(doc = json_loadb((const char *)res->body, res->body_len, 0, NULL)))
		fuzz_fail("answer body is not JSON");
	if (!json_is_object(doc))
		fuzz_fail("answer body is not an object");
	json_decref(doc);
	if (res->http_status < 300 && res->outcome != IDEM_FIRST && res->outcome != IDEM_REPLAY)
		fuzz_fail("2xx answer that is neither first nor replay");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const keys[] = {"fuzz-key-a", "fuzz-key-b", "fuzz-key-c"};
	static const struct {
		write_fn fn;
		const char *path;
	} ops[] = {{idem_pay_create_payment, "/v1/payments"},
	           {idem_pay_refund, "/v1/refunds"},
	           {idem_pay_transfer, "/v1/transfers"},
	           {idem_pay_notify, "/v1/notifications/fuzzch"}};
	fuzz_env *e = fuzz_env_get();
	idem_result res = {0}, again = {0};
	idem_pay_request rq = {0};
	size_t body_len;
	char *body;
	int op, rc;

	if (size < 2)
		return 0;
	op = data[0] % 4;
	body = fuzz_subst(data + 2, size - 2, &body_len);
	rq.caller = op == 3 ? e->channel : e->merchant;
	rq.method = "POST";
	rq.path = ops[op].path;
	rq.body = body;
	rq.body_len = body_len;
	switch (data[1] % 5) {
	case 0: break;
	case 4: rq.key_invalid = 1; break;
	default: rq.key = keys[data[1] % 5 - 1]; rq.key_len = strlen(rq.key);
	}
	rc = ops[op].fn(&res, e->pay, &rq);
	if (rc < 0)
		fuzz_fail(idem_error_last()->message);
	check(&res);
	if (res.stored && res.http_status < 300 && res.outcome == IDEM_FIRST) {
		/* The retry replays the same answer. */
		if (ops[op].fn(&again, e->pay, &rq) < 0)
			fuzz_fail(idem_error_last()->message);
		if (again.outcome != IDEM_REPLAY || again.http_status != res.http_status ||
		    again.body_len != res.body_len || memcmp(again.body, res.body, res.body_len))
			fuzz_fail("retry did not replay the first answer");
		idem_result_clear(&again);
	}
	idem_result_clear(&res);
	free(body);
	return 0;
}
