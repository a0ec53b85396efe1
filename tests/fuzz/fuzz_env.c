/*
 * tests/fuzz/fuzz_env.c: the shared store of the fuzz targets (fuzz_env.h).
 */
#include "fuzz_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

static fuzz_env env;
static int env_ready;
static char dir[256];
static char db_path[300];

void fuzz_fail(const char *what)
{
	fprintf(stderr, "fuzz: %s\n", what);
	abort();
}

char *fuzz_strndup(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);

	if (!s)
		fuzz_fail("out of memory");
	if (size)
		memcpy(s, data, size);
	s[size] = '\0';
	return s;
}

static void env_cleanup(void)
{
	static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
	char path[320];

	if (!env_ready)
		return;
	idem_pay_close(env.pay);
	idem_store_close(env.store);
	for (size_t i = 0; i < sizeof(suffix) / sizeof(suffix[0]); i++) {
		snprintf(path, sizeof(path), "%s%s", db_path, suffix[i]);
		unlink(path);
	}
	rmdir(dir);
	env_ready = 0;
}

/* One payment of 100000 CNY, made SUCCESS by its channel's callback. */
static void make_payment(void)
{
	char body[512];
	idem_result res = {0};
	idem_pay_request rq = {0};
	json_t *doc;
	const char *id;
	int n;

	n = snprintf(body, sizeof(body),
	             "{\"amount\":100000,\"currency\":\"CNY\",\"channel\":\"%s\",\"merchant_order_"
	             "no\":\"seed-1\"}",
	             env.channel);
	rq = (idem_pay_request){env.merchant, "fuzz-seed-payment", 17,   0,
	                        "POST",       "/v1/payments",      body, (size_t)n};
	if (idem_pay_create_payment(&res, env.pay, &rq) < 0 || res.http_status != 201) {
		fprintf(stderr, "fuzz: %d %.*s\n", res.http_status, (int)res.body_len,
		        (const char *)res.body);
		fuzz_fail("cannot create the seed payment");
	}
	doc = json_loadb((const char *)res.body, res.body_len, 0, NULL);
	id = doc ? json_string_value(json_object_get(doc, "id")) : NULL;
	if (!id)
		fuzz_fail("seed payment without an id");
	snprintf(env.payment, sizeof(env.payment), "%s", id);
	json_decref(doc);
	idem_result_clear(&res);
	n = snprintf(body, sizeof(body),
	             "{\"payment_id\":\"%s\",\"channel_txn_id\":\"seed-txn\","
	             "\"status\":\"SUCCESS\",\"amount\":100000,\"notify_id\":\"seed-n\"}",
	             env.payment);
	rq = (idem_pay_request){env.channel, NULL,     0, 0, "POST", "/v1/notifications/fuzzch",
	                        body,        (size_t)n};
	if (idem_pay_notify(&res, env.pay, &rq) < 0 || res.http_status != 200) {
		fprintf(stderr, "fuzz: %d %.*s\n", res.http_status, (int)res.body_len,
		        (const char *)res.body);
		fuzz_fail("cannot settle the seed payment");
	}
	idem_result_clear(&res);
}

char *fuzz_subst(const uint8_t *data, size_t size, size_t *len)
{
	fuzz_env *e = fuzz_env_get();
	const struct {
		const char *tag;
		const char *value;
	} subs[] = {{"@KEY@", e->api_key},
	            {"@MERCHANT@", e->merchant},
	            {"@M2@", e->merchant2},
	            {"@PAY@", e->payment},
	            {"@CH@", e->channel}};
	size_t cap = size + 1, o = 0;
	char *out;

	for (size_t i = 0; i + 1 < size; i++)
		if (data[i] == '@')
			cap += IDEM_PAY_SECRET_SIZE;
	if (!(out = malloc(cap)))
		fuzz_fail("out of memory");
	for (size_t i = 0; i < size;) {
		size_t k = 0, nsubs = sizeof(subs) / sizeof(subs[0]);

		if (data[i] == '@')
			for (; k < nsubs; k++) {
				size_t t = strlen(subs[k].tag);

				if (size - i >= t && memcmp(data + i, subs[k].tag, t) == 0)
					break;
			}
		if (data[i] == '@' && k < nsubs) {
			size_t v = strlen(subs[k].value);

			memcpy(out + o, subs[k].value, v);
			o += v;
			i += strlen(subs[k].tag);
		} else {
			out[o++] = (char)data[i++];
		}
	}
	out[o] = '\0';
	*len = o;
	return out;
}

fuzz_env *fuzz_env_get(void)
{
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	char url[320];
	const char *tmp = getenv("TMPDIR");
	char key2[IDEM_PAY_SECRET_SIZE];

	if (env_ready)
		return &env;
	snprintf(dir, sizeof(dir), "%s/idem-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		fuzz_fail("mkdtemp failed");
	snprintf(db_path, sizeof(db_path), "%s/fuzz.db", dir);
	snprintf(url, sizeof(url), "sqlite:%s", db_path);
	opts.migrate = 1;
	if (idem_store_open(&env.store, url, &opts) < 0)
		fuzz_fail(idem_error_last()->message);
	if (idem_pay_open(&env.pay, env.store, NULL) < 0)
		fuzz_fail(idem_error_last()->message);
	env_ready = 1;
	atexit(env_cleanup);
	snprintf(env.channel, sizeof(env.channel), "fuzzch");
	if (idem_pay_merchant_add(env.pay, "fuzz merchant", env.merchant, env.api_key) < 0 ||
	    idem_pay_merchant_add(env.pay, "fuzz second", env.merchant2, key2) < 0 ||
	    idem_pay_channel_add(env.pay, env.channel, env.secret) < 0)
		fuzz_fail(idem_error_last()->message);
	make_payment();
	return &env;
}
