/*
 * tests/core/test_cache.c: the front cache. Unit tests of the cache itself
 * (hits, mismatches, expiry, the byte and entry caps) and, through a store,
 * the promise that it never answers with a body the database does not hold
 * for that key.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cache.h"
#include "support.h"

static idem__key key_of(const char *scope, const char *key)
{
	idem__key k = {scope, strlen(scope), "payment", 7, key, strlen(key)};

	return k;
}

static void hit_miss_mismatch_expiry(void **state)
{
	idem__cache *c = idem__cache_new(1 << 20, 1000);
	idem__key k = key_of("m_1", "K1"), other = key_of("m_2", "K1");
	idem_result r = {0};
	char fp[65], fp2[65];

	(void)state;
	test_fp(fp, "{\"a\":1}");
	test_fp(fp2, "{\"a\":2}");
	assert_int_equal(idem__cache_get(c, &k, fp, 100, &r), 0);
	idem__cache_put(c, &k, fp, 201, (const unsigned char *)"body\0x", 6, 1000, 100);
	assert_int_equal(idem__cache_get(c, &k, fp, 999, &r), 1);
	assert_int_equal(r.outcome, IDEM_REPLAY);
	assert_int_equal(r.http_status, 201);
	assert_int_equal(r.body_len, 6);
	assert_memory_equal(r.body, "body\0x", 6);
	idem_result_clear(&r);
	assert_int_equal(idem__cache_get(c, &k, fp2, 999, &r), 1);
	assert_int_equal(r.outcome, IDEM_MISMATCH);
	idem_result_clear(&r);
	/* Another scope never sees it. */
	assert_int_equal(idem__cache_get(c, &other, fp, 999, &r), 0);
	/* At expires_at the entry is gone. */
	assert_int_equal(idem__cache_get(c, &k, fp, 1000, &r), 0);
	assert_int_equal(idem__cache_get(c, &k, fp, 500, &r), 0);
	/* Already expired answers are never added. */
	idem__cache_put(c, &k, fp, 201, (const unsigned char *)"x", 1, 1000, 1000);
	assert_int_equal(idem__cache_get(c, &k, fp, 500, &r), 0);
	idem__cache_free(c);
}

/*
 * The replay shortcut: raw bytes answer only after they were noted against
 * the entry's own fingerprint; they never answer MISMATCH, a new answer for
 * the key forgets them, and they count against the byte cap.
 */
static void raw_bytes_only_after_a_note(void **state)
{
	idem__cache *c = idem__cache_new(1 << 20, 1000);
	idem__key k = key_of("m_1", "K1"), other = key_of("m_1", "K2");
	idem_result r = {0};
	idem__cache_stats before, after;
	char fp[65], fp2[65];
	const char *raw = "POST /v1/payments\n{ \"a\": 1 }", *raw2 = "POST /v1/payments\n{\"a\":2}";
	size_t n = strlen(raw), n2 = strlen(raw2);

	(void)state;
	test_fp(fp, "{\"a\":1}");
	test_fp(fp2, "{\"a\":2}");
	idem__cache_put(c, &k, fp, 201, (const unsigned char *)"body", 4, 1000, 100);
	/* Not noted yet: nothing. */
	assert_int_equal(idem__cache_get_raw(c, &k, raw, n, 200, &r), 0);
	/* A note with another fingerprint than the entry's is ignored. */
	idem__cache_note_raw(c, &k, fp2, raw2, n2, 200);
	assert_int_equal(idem__cache_get_raw(c, &k, raw2, n2, 200, &r), 0);
	idem__cache_stats_get(c, &before);
	idem__cache_note_raw(c, &k, fp, raw, n, 200);
	idem__cache_stats_get(c, &after);
	assert_true(after.bytes >= before.bytes + n);
	assert_int_equal(idem__cache_get_raw(c, &k, raw, n, 300, &r), 1);
	assert_int_equal(r.outcome, IDEM_REPLAY);
	assert_int_equal(r.http_status, 201);
	assert_int_equal(r.body_len, 4);
	assert_memory_equal(r.body, "body", 4);
	assert_int_equal(r.expires_at_ms, 1000);
	idem_result_clear(&r);
	/* Other bytes decide nothing here (the canonical path does): a prefix, one more byte. */
	assert_int_equal(idem__cache_get_raw(c, &k, raw2, n2, 300, &r), 0);
	assert_int_equal(idem__cache_get_raw(c, &k, raw, n - 1, 300, &r), 0);
	assert_null(r.body);
	/* Another key never sees them; an expired entry answers nothing. */
	assert_int_equal(idem__cache_get_raw(c, &other, raw, n, 300, &r), 0);
	assert_int_equal(idem__cache_get_raw(c, &k, raw, n, 1000, &r), 0);
	/* A new entry for the key starts without raw bytes. */
	idem__cache_put(c, &k, fp, 201, (const unsigned char *)"body", 4, 2000, 1000);
	assert_int_equal(idem__cache_get_raw(c, &k, raw, n, 1100, &r), 0);
	/* No cache: nothing, and a note is harmless. */
	idem__cache_note_raw(NULL, &k, fp, raw, n, 0);
	assert_int_equal(idem__cache_get_raw(NULL, &k, raw, n, 0, &r), 0);
	idem__cache_free(c);
}

static void caps_bound_memory(void **state)
{
	const size_t cap = 256 * 1024;
	idem__cache *c = idem__cache_new(cap, 1000000);
	idem__cache_stats st;
	unsigned char body[900];
	char fp[65], key[32];

	(void)state;
	memset(body, 'b', sizeof(body));
	test_fp(fp, "{}");
	for (int i = 0; i < 5000; i++) {
		idem__key k;

		snprintf(key, sizeof(key), "K%d", i);
		k = key_of("m_1", key);
		idem__cache_put(c, &k, fp, 200, body, sizeof(body), 1000000, 1);
		idem__cache_stats_get(c, &st);
		assert_true(st.bytes <= cap);
	}
	assert_true(st.evictions > 0);
	assert_true(st.entries > 100);
	/* The newest entries survive, the oldest were evicted. */
	{
		idem_result r = {0};
		idem__key newest = key_of("m_1", "K4999"), oldest = key_of("m_1", "K0");

		assert_int_equal(idem__cache_get(c, &newest, fp, 2, &r), 1);
		idem_result_clear(&r);
		assert_int_equal(idem__cache_get(c, &oldest, fp, 2, &r), 0);
	}
	idem__cache_free(c);

	/* The entry cap holds too. */
	c = idem__cache_new(64 << 20, 160);
	for (int i = 0; i < 1000; i++) {
		idem__key k;

		snprintf(key, sizeof(key), "E%d", i);
		k = key_of("m_1", key);
		idem__cache_put(c, &k, fp, 200, body, 10, 1000000, 1);
	}
	idem__cache_stats_get(c, &st);
	assert_true(st.entries <= 160);
	idem__cache_free(c);
	assert_null(idem__cache_new(0, 10));
}

static int work(idem_txn *txn, void *ctx, idem_response *resp)
{
	(void)txn;
	return idem_response_set(resp, 201, ctx, strlen(ctx));
}

/* Through a store: every cached answer equals what the database holds. */
static void never_a_body_the_database_lacks(void **state)
{
	char *url = test_db_url();
	test_clock clock = {0};
	idem_store_opts opts = IDEM_STORE_OPTS_INIT;
	idem_store *store = NULL;
	idem_request r = IDEM_REQUEST_INIT;
	idem_result res = {0};
	idem_record_info info;
	idem_cache_stats st;
	char fp[65];

	(void)state;
	atomic_store(&clock.now_ms, 1800000000000LL);
	opts.clock = test_clock_read;
	opts.clock_ctx = &clock;
	opts.cache_bytes = 1 << 20;
	opts.cache_entries = 1000;
	assert_int_equal(idem_store_open(&store, url, &opts), 0);
	test_fp(fp, "{}");
	r.scope = "m_1";
	r.business_type = "payment";
	r.key = "K";
	r.key_len = 1;
	r.fingerprint = fp;
	r.ttl_ms = 60000;
	assert_int_equal(idem_execute(&res, store, &r, work, "first body"), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(idem_execute(&res, store, &r, work, "never run"), 0);
		assert_int_equal(res.outcome, IDEM_REPLAY);
		assert_int_equal(idem_record_get(&info, store, "m_1", "payment", "K", 1), 0);
		assert_int_equal(res.body_len, info.body_len);
		assert_memory_equal(res.body, info.body, info.body_len);
		idem_record_info_clear(&info);
		idem_result_clear(&res);
	}
	idem_metrics_cache(store, &st);
	assert_int_equal(st.hits, 3);
	/* Expired: the key is free; the new answer replaces the cached one. */
	test_clock_advance(&clock, 60000);
	assert_int_equal(idem_execute(&res, store, &r, work, "second body"), 0);
	assert_int_equal(res.outcome, IDEM_FIRST);
	idem_result_clear(&res);
	assert_int_equal(idem_execute(&res, store, &r, work, "never run"), 0);
	assert_int_equal(res.outcome, IDEM_REPLAY);
	assert_memory_equal(res.body, "second body", 11);
	idem_result_clear(&res);
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(hit_miss_mismatch_expiry),
	    cmocka_unit_test(raw_bytes_only_after_a_note),
	    cmocka_unit_test(caps_bound_memory),
	    cmocka_unit_test(never_a_body_the_database_lacks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
