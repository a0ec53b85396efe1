/*
 * bench/hist.c: the log-linear histogram of hist.h. Values below 64 ns get a
 * bucket each; above, each power of two is split into 32 equal buckets and a
 * quantile is answered with the middle of its bucket.
 */
#include "hist.h"

static unsigned bucket_of(uint64_t v)
{
	unsigned msb, shift;

	if (v < 64)
		return (unsigned)v;
	if (v >= ((uint64_t)1 << 40))
		return HIST_BUCKETS - 1;
	msb = 63u - (unsigned)__builtin_clzll(v);
	shift = msb - 5u;
	return 64u + (shift - 1u) * 32u + (unsigned)((v >> shift) - 32u);
}

static uint64_t value_of(unsigned b)
{
	unsigned k, shift;
	uint64_t mant;

	if (b < 64)
		return b;
	k = b - 64u;
	shift = k / 32u + 1u;
	mant = (uint64_t)(k % 32u) + 32u;
	return (mant << shift) + (((uint64_t)1 << shift) >> 1);
}

void hist_record(bench_hist *h, uint64_t ns)
{
	h->count[bucket_of(ns)]++;
	h->total++;
	h->sum_ns += ns;
	if (ns > h->max_ns)
		h->max_ns = ns;
}

void hist_merge(bench_hist *dst, const bench_hist *src)
{
	for (unsigned i = 0; i < HIST_BUCKETS; i++)
		dst->count[i] += src->count[i];
	dst->total += src->total;
	dst->sum_ns += src->sum_ns;
	if (src->max_ns > dst->max_ns)
		dst->max_ns = src->max_ns;
}

uint64_t hist_quantile(const bench_hist *h, double q)
{
	uint64_t want, seen = 0;

	if (h->total == 0)
		return 0;
	want = (uint64_t)(q * (double)h->total + 0.5);
	if (want < 1)
		want = 1;
	if (want > h->total)
		want = h->total;
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		seen += h->count[i];
		if (seen >= want) {
			uint64_t v = value_of(i);
			return v > h->max_ns ? h->max_ns : v;
		}
	}
	return h->max_ns;
}
