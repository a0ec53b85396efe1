/*
 * bench/workload.c: the requests idem-bench sends and what it learns from
 * their answers. Every body is a pure function of (type, key index), so a
 * duplicate is byte-for-byte the first request again and idemd must replay
 * it. The bookkeeping here only predicts; verify.c compares the prediction
 * with what the database holds. Nothing here may block: it runs inside the
 * epoll loop of a load thread.
 */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* xorshift64*: fast, seeded, good enough to pick keys. */
uint64_t rng_next(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1DULL;
}

double rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) / (double)(1ULL << 53);
}

int slot_table_init(slot_table *t, size_t size)
{
	memset(t, 0, sizeof(*t));
	t->size = size;
	return pthread_mutex_init(&t->lock, NULL) == 0 ? 0 : -1;
}

void slot_table_free(slot_table *t)
{
	for (unsigned i = 0; i < SLOT_CHUNKS; i++)
		free(atomic_load(&t->chunks[i]));
	pthread_mutex_destroy(&t->lock);
}

/* The slot of a key index, its chunk allocated on first use; NULL when out
 * of memory or beyond the table (SLOT_CHUNK * SLOT_CHUNKS keys). */
void *slot_get(slot_table *t, uint64_t idx)
{
	uint64_t c = idx / SLOT_CHUNK;
	char *chunk;

	if (c >= SLOT_CHUNKS)
		return NULL;
	chunk = atomic_load_explicit(&t->chunks[c], memory_order_acquire);
	if (!chunk) {
		pthread_mutex_lock(&t->lock);
		chunk = atomic_load(&t->chunks[c]);
		if (!chunk && (chunk = calloc(SLOT_CHUNK, t->size)))
			atomic_store_explicit(&t->chunks[c], chunk, memory_order_release);
		pthread_mutex_unlock(&t->lock);
		if (!chunk)
			return NULL;
	}
	return chunk + (idx % SLOT_CHUNK) * t->size;
}

static int64_t pay_amount(uint64_t i)
{
	return 1000 + (int64_t)(i % 9000);
}

static const bench_merchant *merchant_of(const bench *b, uint64_t i)
{
	return &b->cfg.merchants[i % (uint64_t)b->cfg.nmerchants];
}

/* Request line and headers (each line of `headers` ends in CRLF) around a
 * JSON body; -1 when it does not fit. */
static int frame(bench *b, bench_req *rq, const char *path, const char *headers, const char *body,
                 int blen)
{
	int n = snprintf(rq->buf, sizeof(rq->buf),
	                 "POST %s HTTP/1.1\r\nHost: %s:%d\r\n%s"
	                 "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n",
	                 path, b->cfg.host, b->cfg.port, headers, blen);

	if (n < 0 || blen < 0 || (size_t)n + (size_t)blen >= sizeof(rq->buf))
		return -1;
	memcpy(rq->buf + n, body, (size_t)blen);
	rq->len = (size_t)n + (size_t)blen;
	return 0;
}

static int build_payment(bench *b, bench_req *rq, uint64_t i)
{
	char key[64], body[512], hdr[320];
	int blen;

	snprintf(key, sizeof(key), "P%s-%llu", b->cfg.run_id, (unsigned long long)i);
	snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s\r\nIdempotency-Key: %s\r\n",
	         merchant_of(b, i)->key, key);
	blen = snprintf(body, sizeof(body),
	                "{\"merchant_order_no\":\"%s\",\"amount\":%lld,\"currency\":\"CNY\","
	                "\"channel\":\"%s\"}",
	                key, (long long)pay_amount(i), b->cfg.channel);
	if (blen < 0 || (size_t)blen >= sizeof(body))
		return -1;
	return frame(b, rq, "/v1/payments", hdr, body, blen);
}

static int build_notification(bench *b, bench_req *rq, uint64_t p, const pay_slot *ps)
{
	char body[512], path[128], sig[2 * EVP_MAX_MD_SIZE + 1], hdr[200];
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int maclen = 0;
	int blen;

	blen = snprintf(body, sizeof(body),
	                "{\"notify_id\":\"N%s-%llu\",\"payment_id\":\"%s\",\"channel_txn_id\":"
	                "\"T%s-%llu\",\"status\":\"SUCCESS\",\"amount\":%lld}",
	                b->cfg.run_id, (unsigned long long)p, ps->id, b->cfg.run_id,
	                (unsigned long long)p, (long long)pay_amount(p));
	if (blen < 0 || (size_t)blen >= sizeof(body))
		return -1;
	if (!HMAC(EVP_sha256(), b->cfg.channel_secret, (int)strlen(b->cfg.channel_secret),
	          (const unsigned char *)body, (size_t)blen, mac, &maclen))
		return -1;
	for (unsigned k = 0; k < maclen; k++)
		snprintf(sig + 2 * k, 3, "%02x", mac[k]);
	sig[2 * maclen] = '\0';
	snprintf(path, sizeof(path), "/v1/notifications/%s", b->cfg.channel);
	snprintf(hdr, sizeof(hdr), "X-Signature: %s\r\n", sig);
	return frame(b, rq, path, hdr, body, blen);
}

static int build_refund(bench *b, bench_req *rq, uint64_t r, uint64_t p, const pay_slot *ps)
{
	char body[512], bearer[200];
	int blen;

	snprintf(bearer, sizeof(bearer), "Authorization: Bearer %s\r\n", merchant_of(b, p)->key);
	blen = snprintf(body, sizeof(body),
	                "{\"refund_request_no\":\"R%s-%llu\",\"payment_id\":\"%s\",\"amount\":1}",
	                b->cfg.run_id, (unsigned long long)r, ps->id);
	if (blen < 0 || (size_t)blen >= sizeof(body))
		return -1;
	return frame(b, rq, "/v1/refunds", bearer, body, blen);
}

static int build_transfer(bench *b, bench_req *rq, uint64_t x)
{
	char body[512], bearer[200];
	const bench_merchant *to = &b->cfg.merchants[(x + 1) % (uint64_t)b->cfg.nmerchants];
	int blen;

	snprintf(bearer, sizeof(bearer), "Authorization: Bearer %s\r\n", merchant_of(b, x)->key);
	blen = snprintf(body, sizeof(body),
	                "{\"transfer_no\":\"X%s-%llu\",\"to_merchant\":\"%s\",\"amount\":1,"
	                "\"currency\":\"CNY\"}",
	                b->cfg.run_id, (unsigned long long)x, to->id);
	if (blen < 0 || (size_t)blen >= sizeof(body))
		return -1;
	return frame(b, rq, "/v1/transfers", bearer, body, blen);
}

/* A payment that can be referred to: acknowledged, its id known. */
static pay_slot *ready_payment(bench *b, uint64_t p, unsigned need)
{
	pay_slot *ps = slot_get(&b->pays, p);

	if (!ps || (atomic_load_explicit(&ps->flags, memory_order_acquire) & need) != need)
		return NULL;
	return ps;
}

/* A fresh index of `type`, or UINT64_MAX when the key space is used up. */
static uint64_t fresh(bench *b, req_type type)
{
	uint64_t i = atomic_fetch_add(&b->alloc[type], 1);

	if (i >= b->cfg.keys) {
		atomic_fetch_sub(&b->alloc[type], 1);
		return UINT64_MAX;
	}
	return i;
}

/* An index to repeat: a hot key, or any key sent a while ago (not the
 * newest `concurrency`, which are likely still in flight). */
static uint64_t repeat(bench *b, bench_thread *t, req_type type)
{
	uint64_t n = atomic_load(&b->alloc[type]), lag = (uint64_t)b->cfg.concurrency;

	if (type == REQ_PAYMENT && b->cfg.hot_keys > 0)
		n = n < b->cfg.hot_keys ? n : b->cfg.hot_keys;
	else
		n = n > lag ? n - lag : 0;
	return n == 0 ? UINT64_MAX : rng_next(&t->rng) % n;
}

static int next_payment(bench *b, bench_thread *t, bench_req *rq, int dup)
{
	uint64_t i = dup ? repeat(b, t, REQ_PAYMENT) : UINT64_MAX;
	pay_slot *ps;

	rq->dup = i != UINT64_MAX;
	if (i == UINT64_MAX && (i = fresh(b, REQ_PAYMENT)) == UINT64_MAX) {
		/* key space used up: every request repeats one */
		if ((i = repeat(b, t, REQ_PAYMENT)) == UINT64_MAX)
			return 1;
		rq->dup = 1;
	}
	if (!(ps = slot_get(&b->pays, i)))
		return -1;
	atomic_fetch_or(&ps->flags, F_SENT);
	rq->type = REQ_PAYMENT;
	rq->idx = i;
	return build_payment(b, rq, i);
}

static int next_notification(bench *b, bench_thread *t, bench_req *rq, int dup)
{
	uint64_t p, lag = (uint64_t)b->cfg.concurrency;
	pay_slot *ps = NULL;

	if (dup) {
		uint64_t n = atomic_load(&b->notify_next);

		for (int tries = 0; n > 0 && !ps && tries < 4; tries++) {
			p = rng_next(&t->rng) % n;
			ps = ready_payment(b, p, F_ID | F_NSENT);
		}
		rq->dup = ps != NULL;
	}
	if (!ps) {
		p = atomic_load(&b->notify_next);
		if (p + lag >= atomic_load(&b->alloc[REQ_PAYMENT]) ||
		    !atomic_compare_exchange_strong(&b->notify_next, &p, p + 1) ||
		    !(ps = ready_payment(b, p, F_ID)))
			return next_payment(b, t, rq, 0);
	}
	atomic_fetch_or(&ps->flags, F_NSENT);
	rq->type = REQ_NOTIFICATION;
	rq->idx = p;
	return build_notification(b, rq, p, ps);
}

static int next_refund(bench *b, bench_thread *t, bench_req *rq, int dup)
{
	uint64_t r = dup ? repeat(b, t, REQ_REFUND) : UINT64_MAX, p = 0;
	key_slot *ks = NULL;
	pay_slot *ps = NULL;

	if (r != UINT64_MAX) {
		ks = slot_get(&b->refunds, r);
		if (ks && (atomic_load_explicit(&ks->flags, memory_order_acquire) & F_SENT))
			ps = ready_payment(b, p = ks->pay, F_ID);
		rq->dup = ps != NULL;
	}
	if (!ps) {
		uint64_t n = atomic_load(&b->notify_next);

		for (int tries = 0; n > 0 && !ps && tries < 4; tries++) {
			p = rng_next(&t->rng) % n;
			ps = ready_payment(b, p, F_ID | F_NACK);
		}
		if (!ps || (r = fresh(b, REQ_REFUND)) == UINT64_MAX)
			return next_notification(b, t, rq, 0);
		if (!(ks = slot_get(&b->refunds, r)))
			return -1;
		ks->pay = p;
		atomic_fetch_or_explicit(&ks->flags, F_SENT, memory_order_release);
	}
	rq->type = REQ_REFUND;
	rq->idx = r;
	return build_refund(b, rq, r, p, ps);
}

static int next_transfer(bench *b, bench_thread *t, bench_req *rq, int dup)
{
	uint64_t x = dup ? repeat(b, t, REQ_TRANSFER) : UINT64_MAX;
	key_slot *ks;

	if (b->cfg.nmerchants < 2 || !b->cfg.merchants[1].id[0])
		return next_payment(b, t, rq, dup);
	rq->dup = x != UINT64_MAX;
	if (x == UINT64_MAX && (x = fresh(b, REQ_TRANSFER)) == UINT64_MAX)
		return next_payment(b, t, rq, dup);
	if (!(ks = slot_get(&b->transfers, x)))
		return -1;
	atomic_fetch_or(&ks->flags, F_SENT);
	rq->type = REQ_TRANSFER;
	rq->idx = x;
	return build_transfer(b, rq, x);
}

/*
 * The next request of this thread: 0 built, 1 nothing more to send in this
 * phase, -1 could not build (out of memory, too long).
 */
int workload_next(bench *b, bench_thread *t, bench_req *rq)
{
	unsigned w;
	int dup;

	if (atomic_load_explicit(&b->stop, memory_order_relaxed))
		return 1;
	if (b->phase == PHASE_WARM) {
		/* the hot keys, each sent once, before any timing */
		uint64_t i = atomic_fetch_add(&b->alloc[REQ_PAYMENT], 1);
		pay_slot *ps;

		if (i >= b->cfg.hot_keys) {
			atomic_fetch_sub(&b->alloc[REQ_PAYMENT], 1);
			return 1;
		}
		if (!(ps = slot_get(&b->pays, i)))
			return -1;
		atomic_fetch_or(&ps->flags, F_SENT);
		rq->type = REQ_PAYMENT;
		rq->idx = i;
		rq->dup = 0;
		return build_payment(b, rq, i);
	}
	if (b->cfg.requests && atomic_fetch_add(&b->issued, 1) >= b->cfg.requests)
		return 1;
	dup = b->cfg.dup_ratio > 0 && rng_unit(&t->rng) < b->cfg.dup_ratio;
	w = (unsigned)(rng_next(&t->rng) % b->cfg.mix_total);
	if (w < b->cfg.mix[REQ_PAYMENT])
		return next_payment(b, t, rq, dup);
	w -= b->cfg.mix[REQ_PAYMENT];
	if (w < b->cfg.mix[REQ_NOTIFICATION])
		return next_notification(b, t, rq, dup);
	w -= b->cfg.mix[REQ_NOTIFICATION];
	if (w < b->cfg.mix[REQ_REFUND])
		return next_refund(b, t, rq, dup);
	return next_transfer(b, t, rq, dup);
}

/* The value of "id" in a compact JSON object, into out; 0 or -1. */
static int json_id(const char *body, size_t len, char *out, size_t outlen)
{
	static const char pat[] = "\"id\":\"";
	const char *end = body + len, *p, *q;

	for (p = body; p + sizeof(pat) - 1 <= end; p++) {
		if (memcmp(p, pat, sizeof(pat) - 1) != 0)
			continue;
		p += sizeof(pat) - 1;
		for (q = p; q < end && *q != '"'; q++)
			;
		if (q == end || (size_t)(q - p) >= outlen)
			return -1;
		memcpy(out, p, (size_t)(q - p));
		out[q - p] = '\0';
		return 0;
	}
	return -1;
}

void workload_answer(bench *b, bench_thread *t, const bench_req *rq, int status, const char *body,
                     size_t len)
{
	pay_slot *ps;
	key_slot *ks;
	unsigned old;

	(void)t;
	switch (rq->type) {
	case REQ_PAYMENT:
		if (status != 201 && status != 200)
			break;
		ps = slot_get(&b->pays, rq->idx);
		old = atomic_fetch_or(&ps->flags, F_ACK);
		if (!(old & F_ACK) && json_id(body, len, ps->id, sizeof(ps->id)) == 0)
			atomic_fetch_or_explicit(&ps->flags, F_ID, memory_order_release);
		break;
	case REQ_NOTIFICATION:
		if (status != 200)
			break;
		ps = slot_get(&b->pays, rq->idx);
		old = atomic_fetch_or(&ps->flags, F_NACK);
		if (!(old & F_NACK))
			atomic_fetch_add(
			    &b->cfg.merchants[rq->idx % (uint64_t)b->cfg.nmerchants].expected_delta,
			    pay_amount(rq->idx));
		break;
	case REQ_REFUND:
		if (status != 201)
			break;
		ks = slot_get(&b->refunds, rq->idx);
		old = atomic_fetch_or(&ks->flags, F_ACK);
		if (!(old & F_ACK))
			atomic_fetch_sub(
			    &b->cfg.merchants[ks->pay % (uint64_t)b->cfg.nmerchants].expected_delta,
			    1);
		break;
	case REQ_TRANSFER:
		if (status != 201)
			break;
		ks = slot_get(&b->transfers, rq->idx);
		old = atomic_fetch_or(&ks->flags, F_ACK);
		if (!(old & F_ACK)) {
			uint64_t m = (uint64_t)b->cfg.nmerchants;

			atomic_fetch_sub(&b->cfg.merchants[rq->idx % m].expected_delta, 1);
			atomic_fetch_add(&b->cfg.merchants[(rq->idx + 1) % m].expected_delta, 1);
		}
		break;
	default: break;
	}
}

/* A request that got no answer: it may or may not have taken effect. */
void workload_lost(bench *b, const bench_req *rq)
{
	switch (rq->type) {
	case REQ_PAYMENT:
		atomic_fetch_or(&((pay_slot *)slot_get(&b->pays, rq->idx))->flags, F_UNSURE);
		break;
	case REQ_NOTIFICATION:
		atomic_fetch_or(&((pay_slot *)slot_get(&b->pays, rq->idx))->flags, F_NUNSURE);
		break;
	case REQ_REFUND:
		atomic_fetch_or(&((key_slot *)slot_get(&b->refunds, rq->idx))->flags, F_UNSURE);
		break;
	case REQ_TRANSFER:
		atomic_fetch_or(&((key_slot *)slot_get(&b->transfers, rq->idx))->flags, F_UNSURE);
		break;
	default: break;
	}
}
