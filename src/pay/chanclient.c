/*
 * pay/chanclient.c: the client side of CHANNEL.md. Every request is signed
 * (X-Signature: hex HMAC-SHA256 of the body, or of the path and query for a
 * GET) and carries a fresh X-Request-Id; every answer must be signed the same
 * way. An answer is definite only when it is a signed JSON object with a
 * code: 2xx with "OK", or 4xx with the channel's refusal code. Anything else
 * (timeout, refused or reset connection, 5xx, an unparsable or unsigned
 * answer) is unknown: the call may have taken effect, and the caller must
 * not guess. Also here: the channel configuration cache and the channel
 * and sweeper counters rendered for /metrics.
 */
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pay/channel.h"
#include "util/error.h"
#include "util/rand.h"

#define ANSWER_MAX   (64 * 1024) /* a channel's answer is small; more is garbage */
#define CACHE_TTL_MS 5000
#define MAX_CHANNELS 64

static const char *const call_names[PAY__CH_CALLS] = {"create", "query", "close", "refund",
                                                      "refund_query"};
static const char *const outcome_names[3] = {"ok", "declined", "unknown"};
static const char *const sweep_outcomes[] = {"paid",   "pending", "failed",
                                             "closed", "settled", "refund_done"};
#define SWEEP_OUTCOMES (sizeof(sweep_outcomes) / sizeof(sweep_outcomes[0]))

typedef struct {
	pay__chan ch;
	int found;
	int64_t loaded_at;
} cache_entry;

struct pay__chanstate {
	pthread_mutex_t lock;
	cache_entry cache[MAX_CHANNELS];
	int ncache;
	char counted[MAX_CHANNELS][IDEM_PAY_CHANNEL_MAX + 1];
	_Atomic uint64_t calls[MAX_CHANNELS][PAY__CH_CALLS][3];
	int ncounted;
	_Atomic uint64_t sweeps, resolved[SWEEP_OUTCOMES];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_start(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT); /* once, before any worker exists */
}

pay__chanstate *pay__chanstate_new(void)
{
	pay__chanstate *s = calloc(1, sizeof(*s));

	pthread_once(&curl_once, curl_start);

	if (s)
		pthread_mutex_init(&s->lock, NULL);
	return s;
}

void pay__chanstate_free(pay__chanstate *s)
{
	if (!s)
		return;
	OPENSSL_cleanse(s->cache, sizeof(s->cache));
	pthread_mutex_destroy(&s->lock);
	free(s);
}

/* ---- configuration ---------------------------------------------------- */

/* From memory: 1 with out and *found when fresh; 0 and *slot (-1: none) else. */
static int chan_cached(pay__chanstate *s, const char *name, int64_t now, pay__chan *out, int *found,
                       int *slot)
{
	int fresh;

	memset(out, 0, sizeof(*out));
	*found = 0;
	*slot = -1;
	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < s->ncache; i++)
		if (strcmp(s->cache[i].ch.name, name) == 0) {
			*slot = i;
			break;
		}
	fresh = *slot >= 0 && now - s->cache[*slot].loaded_at < CACHE_TTL_MS;
	if (fresh) {
		*out = s->cache[*slot].ch;
		*found = s->cache[*slot].found;
	}
	pthread_mutex_unlock(&s->lock);
	return fresh;
}

int pay__chan_get_cached(idem_pay *pay, const char *name, pay__chan *out, int *found)
{
	int slot;

	return chan_cached(pay->chans, name, pay__now(pay), out, found, &slot);
}

int pay__chan_get(idem_pay *pay, const char *name, pay__chan *out, int *found)
{
	pay__chanstate *s = pay->chans;
	int64_t now = pay__now(pay);
	int rc, slot;

	if (chan_cached(s, name, now, out, found, &slot))
		return 0;
	if ((rc = pay__chan_load(pay, name, out, found)) < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	if (slot < 0 || strcmp(s->cache[slot].ch.name, name) != 0) {
		slot = -1;
		for (int i = 0; i < s->ncache && slot < 0; i++)
			if (strcmp(s->cache[i].ch.name, name) == 0)
				slot = i;
		if (slot < 0 && s->ncache < MAX_CHANNELS)
			slot = s->ncache++;
	}
	if (slot >= 0) {
		s->cache[slot].ch = *out;
		snprintf(s->cache[slot].ch.name, sizeof(s->cache[slot].ch.name), "%s", name);
		s->cache[slot].found = *found;
		s->cache[slot].loaded_at = now;
	}
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* ---- metrics ---------------------------------------------------------- */

static int counter_slot(pay__chanstate *s, const char *channel)
{
	int slot = -1;

	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < s->ncounted && slot < 0; i++)
		if (strcmp(s->counted[i], channel) == 0)
			slot = i;
	if (slot < 0 && s->ncounted < MAX_CHANNELS) {
		slot = s->ncounted;
		snprintf(s->counted[slot], sizeof(s->counted[slot]), "%s", channel);
		s->ncounted++;
	}
	pthread_mutex_unlock(&s->lock);
	return slot;
}

void pay__ch_count(idem_pay *pay, const char *channel, pay__ch_kind call, pay__ch_outcome outcome)
{
	int slot = counter_slot(pay->chans, channel);

	if (slot >= 0)
		atomic_fetch_add_explicit(&pay->chans->calls[slot][call][outcome], 1,
		                          memory_order_relaxed);
}

void pay__sweep_count(idem_pay *pay, const char *outcome)
{
	if (!outcome) {
		atomic_fetch_add_explicit(&pay->chans->sweeps, 1, memory_order_relaxed);
		return;
	}
	for (size_t i = 0; i < SWEEP_OUTCOMES; i++)
		if (strcmp(sweep_outcomes[i], outcome) == 0)
			atomic_fetch_add_explicit(&pay->chans->resolved[i], 1,
			                          memory_order_relaxed);
}

typedef struct {
	char *p;
	size_t len, cap;
	int failed;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	while (!t->failed) {
		va_start(ap, fmt);
		n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->failed = 1;
		} else if (t->p && (size_t)n < t->cap - t->len) {
			t->len += (size_t)n;
			return;
		} else {
			size_t cap = t->cap ? t->cap * 2 : 4096;
			char *p;

			while (cap - t->len <= (size_t)n)
				cap *= 2;
			if (!(p = realloc(t->p, cap)))
				t->failed = 1;
			else {
				t->p = p;
				t->cap = cap;
			}
		}
	}
}

int idem_pay_metrics_text(idem_pay *pay, char **out, size_t *len)
{
	pay__chanstate *s = NULL;
	text t = {NULL, 0, 0, 0};
	int n;

	IDEM__ASSERT_ARG(out);
	IDEM__ASSERT_ARG(len);
	*out = NULL;
	*len = 0;
	IDEM__ASSERT_ARG(pay);
	s = pay->chans;
	put(&t, "# HELP idem_channel_calls_total Calls to connected channels by outcome.\n"
	        "# TYPE idem_channel_calls_total counter\n");
	pthread_mutex_lock(&s->lock);
	n = s->ncounted;
	pthread_mutex_unlock(&s->lock);
	for (int i = 0; i < n; i++)
		for (int c = 0; c < PAY__CH_CALLS; c++)
			for (int o = 0; o < 3; o++)
				put(&t,
				    "idem_channel_calls_total{channel=\"%s\",call=\"%s\","
				    "outcome=\"%s\"} %llu\n",
				    s->counted[i], call_names[c], outcome_names[o],
				    (unsigned long long)atomic_load(&s->calls[i][c][o]));
	put(&t,
	    "# HELP idem_channel_queue_depth Channel calls waiting for a worker.\n"
	    "# TYPE idem_channel_queue_depth gauge\nidem_channel_queue_depth %d\n",
	    pay__pool_depth(pay->pool));
	put(&t,
	    "# HELP idem_sweeper_runs_total Sweeper passes this instance ran (it held the "
	    "lease).\n# TYPE idem_sweeper_runs_total counter\nidem_sweeper_runs_total %llu\n",
	    (unsigned long long)atomic_load(&s->sweeps));
	put(&t, "# HELP idem_sweeper_resolved_total Requests the sweeper resolved, by outcome.\n"
	        "# TYPE idem_sweeper_resolved_total counter\n");
	for (size_t i = 0; i < SWEEP_OUTCOMES; i++)
		put(&t, "idem_sweeper_resolved_total{outcome=\"%s\"} %llu\n", sweep_outcomes[i],
		    (unsigned long long)atomic_load(&s->resolved[i]));
	if (t.failed) {
		free(t.p);
		return idem__error(IDEM_ENOMEM, "out of memory");
	}
	*out = t.p;
	*len = t.len;
	return 0;
}

/* ---- one call --------------------------------------------------------- */

void pay__ch_reply_clear(pay__ch_reply *r)
{
	json_decref(r->doc);
	memset(r, 0, sizeof(*r));
}

typedef struct {
	char *p;
	size_t len;
	int too_big;
	char sig[72];
} answer;

static size_t on_body(char *data, size_t size, size_t n, void *ctx)
{
	answer *a = ctx;
	size_t len = size * n;
	char *p;

	if (a->len + len > ANSWER_MAX) {
		a->too_big = 1;
		return 0; /* abort the transfer */
	}
	if (!(p = realloc(a->p, a->len + len + 1)))
		return 0;
	memcpy(p + a->len, data, len);
	a->p = p;
	a->len += len;
	a->p[a->len] = '\0';
	return len;
}

static size_t on_header(char *data, size_t size, size_t n, void *ctx)
{
	answer *a = ctx;
	size_t len = size * n;
	static const char name[] = "x-signature:";

	if (len > sizeof(name) - 1 && strncasecmp(data, name, sizeof(name) - 1) == 0) {
		size_t i = sizeof(name) - 1, j = 0;

		while (i < len && (data[i] == ' ' || data[i] == '\t'))
			i++;
		while (i < len && data[i] != '\r' && data[i] != '\n' && j < sizeof(a->sig) - 1)
			a->sig[j++] = data[i++];
		a->sig[j] = '\0';
	}
	return len;
}

static int hmac_hex(const char *secret, const void *data, size_t len, char out[65])
{
	unsigned char md[32];
	unsigned int n = 0;
	static const char hex[] = "0123456789abcdef";

	if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), data, len, md, &n) || n != 32)
		return -1;
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hex[md[i] >> 4];
		out[2 * i + 1] = hex[md[i] & 15];
	}
	out[64] = '\0';
	return 0;
}

static void unknown(pay__ch_reply *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void unknown(pay__ch_reply *out, const char *fmt, ...)
{
	va_list ap;

	json_decref(out->doc);
	out->doc = NULL;
	out->outcome = PAY__CH_UNKNOWN;
	va_start(ap, fmt);
	vsnprintf(out->why, sizeof(out->why), fmt, ap);
	va_end(ap);
}

/* Sort a complete HTTP answer into OK, DECLINED or UNKNOWN. */
static void classify(const pay__chan *ch, answer *a, long status, pay__ch_reply *out)
{
	char want[65];
	json_t *code;

	out->http_status = (int)status;
	/* 401: the channel did not take the request as ours (a secret being
	 * rotated, a misconfiguration): no refusal of the order itself. */
	if (status >= 500 || status < 200 || (status >= 300 && status < 400) || status == 401) {
		unknown(out, "HTTP %ld", status);
		return;
	}
	if (!a->p || hmac_hex(ch->secret, a->p, a->len, want) < 0 || strlen(a->sig) != 64 ||
	    CRYPTO_memcmp(want, a->sig, 64) != 0) {
		unknown(out, "HTTP %ld with a missing or wrong X-Signature", status);
		return;
	}
	if (!(out->doc = json_loadb(a->p, a->len, 0, NULL)) || !json_is_object(out->doc) ||
	    !json_is_string(code = json_object_get(out->doc, "code"))) {
		unknown(out, "HTTP %ld with an unparsable answer", status);
		return;
	}
	snprintf(out->code, sizeof(out->code), "%s", json_string_value(code));
	if (status < 300 && strcmp(out->code, "OK") == 0)
		out->outcome = PAY__CH_OK;
	else if (strcmp(out->code, "SIGN_ERROR") == 0)
		unknown(out, "HTTP %ld: the channel refused our signature", status);
	else if (status >= 400 && status < 500 && strcmp(out->code, "OK") != 0 && out->code[0])
		out->outcome = PAY__CH_DECLINED;
	else
		unknown(out, "HTTP %ld with code '%.32s'", status, out->code);
}

void pay__ch_call(idem_pay *pay, CURL *h, const pay__chan *ch, pay__ch_kind call,
                  const char *method, const char *path, const char *body, pay__ch_reply *out)
{
	char url[1024], sig[65], hdr_sig[96], hdr_id[80], rid[33];
	struct curl_slist *hdrs = NULL;
	answer a = {NULL, 0, 0, ""};
	long status = 0;
	CURLcode cc;
	int post = strcmp(method, "POST") == 0;

	memset(out, 0, sizeof(*out));
	if (snprintf(url, sizeof(url), "%s%s", ch->base_url, path) >= (int)sizeof(url)) {
		unknown(out, "URL too long");
		goto done;
	}
	if (hmac_hex(ch->secret, post ? body : path, strlen(post ? body : path), sig) < 0 ||
	    idem__rand_hex(rid, 16) < 0) {
		unknown(out, "cannot sign the request");
		goto done;
	}
	snprintf(hdr_sig, sizeof(hdr_sig), "X-Signature: %s", sig);
	snprintf(hdr_id, sizeof(hdr_id), "X-Request-Id: %s", rid);
	if (!(hdrs = curl_slist_append(NULL, hdr_sig)) || !curl_slist_append(hdrs, hdr_id) ||
	    !curl_slist_append(hdrs, "Content-Type: application/json") ||
	    !curl_slist_append(hdrs, "Expect:")) {
		unknown(out, "out of memory");
		goto done;
	}
	curl_easy_reset(h);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)ch->timeout_ms);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)ch->timeout_ms);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &a);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, &a);
	if (post) {
		curl_easy_setopt(h, CURLOPT_POST, 1L);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
	}
	cc = curl_easy_perform(h);
	if (cc != CURLE_OK) {
		unknown(out, "%s%s", a.too_big ? "answer too large: " : "", curl_easy_strerror(cc));
		goto done;
	}
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	classify(ch, &a, status, out);
done:
	curl_slist_free_all(hdrs);
	free(a.p);
	pay__ch_count(pay, ch->name, call, out->outcome);
}
