/*
 * idem/metrics.h: counters a store keeps per business type and outcome, and
 * store errors per class. Reading them never touches the database. A NULL
 * store or out reads nothing: the void calls return at once, the counts are
 * 0, with IDEM_EINVAL naming the argument in idem_error_last().
 */
#ifndef IDEM_METRICS_H
#define IDEM_METRICS_H

#include "claim.h"
#include "common.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Outcome index for counters: the idem_outcome values, plus errors. */
#define IDEM_COUNT_ERROR 0

/*
 * Called once per business type seen. counts[o] for o in 1..IDEM_OUTCOME_COUNT
 * is the number of claims with that outcome; counts[IDEM_COUNT_ERROR] the
 * number that ended in an error. Borrowed for the call.
 */
typedef void (*idem_counter_fn)(void *ctx, const char *business_type,
                                const uint64_t counts[IDEM_OUTCOME_COUNT + 1]);

/* Visit the per-type counters of store. fn is required. */
IDEM_EXTERN void idem_metrics_each(idem_store *store, idem_counter_fn fn, void *ctx);

/* Store errors seen, by class (index: idem_error_class). */
IDEM_EXTERN uint64_t idem_metrics_store_errors(idem_store *store, idem_error_class cls);

/* The front cache's counters (all 0 when the cache is off, or store is NULL). */
typedef struct {
	uint64_t hits, misses, evictions, entries, bytes;
} idem_cache_stats;

IDEM_EXTERN void idem_metrics_cache(idem_store *store, idem_cache_stats *out);

/* Records removed by idem_store_purge since open. */
IDEM_EXTERN uint64_t idem_metrics_purged(idem_store *store);

#ifdef __cplusplus
}
#endif
#endif
