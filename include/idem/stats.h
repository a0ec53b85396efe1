/*
 * idem/stats.h: the outcome counters every idemd instance flushes to the store, and
 * reading them back summed over every instance (idemctl stats).
 * NULL handle or required pointer: IDEM_EINVAL (idem/common.h).
 */
#ifndef IDEM_STATS_H
#define IDEM_STATS_H

#include "common.h"
#include "pay.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- stats ------------------------------------------------------------- */

typedef struct idem_stats_flusher idem_stats_flusher;

#define IDEM_STATS_FLUSHER_OPTS_VERSION 1

typedef struct {
	unsigned int version; /* IDEM_STATS_FLUSHER_OPTS_VERSION */
	int interval_ms;      /* time between flushes (default 5000; 50..3600000) */
} idem_stats_flusher_opts;

#define IDEM_STATS_FLUSHER_OPTS_INIT                                                               \
	{                                                                                          \
		IDEM_STATS_FLUSHER_OPTS_VERSION, 5000                                              \
	}

/*
 * Start a background thread that, every interval, writes what store's
 * outcome counters (idem_metrics_each) gained since the last flush to the
 * idem_stats table: one row per (instance, interval, business type, outcome)
 * with a non-zero count, all in one transaction. One write per interval,
 * never one per request. The instance id is random per call, so every
 * process is told apart. A failed flush is retried with the next one (the
 * counts are carried over, not lost).
 * out:   receives the handle (NULL on failure). store must outlive it.
 * opts:  NULL for the defaults.
 * Returns 0, IDEM_EINVAL for bad opts, IDEM_ENOMEM, IDEM_ESTORE when the
 * thread cannot be started.
 */
IDEM_EXTERN int idem_stats_flusher_start(idem_stats_flusher **out, idem_store *store,
                                         const idem_stats_flusher_opts *opts);

/*
 * The instance id rows are written under ("i_" + 16 hex). Borrowed.
 * NULL f: "" (and IDEM_EINVAL in idem_error_last()).
 */
IDEM_EXTERN const char *idem_stats_flusher_instance(const idem_stats_flusher *f);

/* Flush now (on the caller's thread); 0 or a store error. */
IDEM_EXTERN int idem_stats_flusher_flush(idem_stats_flusher *f);

/* Stop the thread, flush a last time and free f. NULL is accepted. */
IDEM_EXTERN void idem_stats_flusher_stop(idem_stats_flusher *f);

/* Per business type, what the stats calls report. */
typedef struct {
	char business_type[IDEM_TYPE_MAX + 1];
	/* Index: idem_outcome (1..4); [0] (IDEM_COUNT_ERROR) counts errors. */
	int64_t outcomes[IDEM_OUTCOME_COUNT + 1];
	/* Stored records now, by status. */
	int64_t processing, succeeded, failed;
} idem_stats_type;

typedef struct {
	int64_t window_ms;
	int64_t requests;       /* claims in the window: first + replay + in_progress + mismatch */
	int64_t duplicates;     /* replay + in_progress + mismatch */
	int64_t errors;         /* claims that ended in a store error */
	int instances;          /* distinct idemd instances that flushed in the window */
	idem_stats_type *types; /* owned; ordered by business type */
	size_t ntypes;
} idem_stats_report;

/*
 * Sum the flushed counters of every instance over intervals that ended in
 * the last window_ms, and count stored records by type and status.
 * out: receives the report; free it with idem_stats_report_clear (also after
 * an error). Returns 0, IDEM_EINVAL (window_ms <= 0), a store error.
 */
IDEM_EXTERN int idem_stats_read(idem_stats_report *out, idem_store *store, int64_t window_ms);

/* Free what r owns and zero it. NULL is accepted. */
IDEM_EXTERN void idem_stats_report_clear(idem_stats_report *r);

/*
 * Delete flushed counters whose interval ended more than keep_ms ago, so
 * the stats table does not grow for ever (idemctl purge calls it).
 * deleted_out (may be NULL) receives the number of rows deleted.
 * Returns 0, IDEM_EINVAL (keep_ms <= 0), a store error.
 */
IDEM_EXTERN int idem_stats_prune(idem_store *store, int64_t keep_ms, int64_t *deleted_out);

#ifdef __cplusplus
}
#endif
#endif
