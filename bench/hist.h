/*
 * bench/hist.h: a log-linear latency histogram (HdrHistogram-like: 32
 * linear sub-buckets per power of two, so any reported percentile is within
 * about 3 % of the true value). Fixed size, no allocation; one per thread,
 * merged at the end. Never shared between threads while recording.
 */
#ifndef IDEM_BENCH_HIST_H
#define IDEM_BENCH_HIST_H

#include <stdint.h>

#define HIST_BUCKETS 1216 /* covers 0 .. 2^40 ns (about 18 minutes) */

typedef struct {
	uint64_t count[HIST_BUCKETS];
	uint64_t total;
	uint64_t max_ns;
	uint64_t sum_ns;
} bench_hist;

/* Records one latency in nanoseconds. */
void hist_record(bench_hist *h, uint64_t ns);

/* Adds every count of src into dst. */
void hist_merge(bench_hist *dst, const bench_hist *src);

/* The value at quantile q (0 < q <= 1) in nanoseconds, 0 when empty. */
uint64_t hist_quantile(const bench_hist *h, double q);

#endif
