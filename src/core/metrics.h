/*
 * core/metrics.h: lock-free counters per business type and outcome. A
 * request bumps one atomic counter; readers take a snapshot. Types are
 * registered once (under a mutex) and never removed.
 */
#ifndef IDEM_CORE_METRICS_H
#define IDEM_CORE_METRICS_H

#include <pthread.h>
#include <stdatomic.h>

#include "idem/claim.h"
#include "idem/common.h"

#define IDEM__METRIC_TYPES 64

typedef struct {
	char name[IDEM_TYPE_MAX + 1];
	_Atomic uint64_t counts[IDEM_OUTCOME_COUNT + 1];
} idem__type_counters;

typedef struct {
	pthread_mutex_t lock;
	_Atomic int ntypes;
	idem__type_counters types[IDEM__METRIC_TYPES];
	_Atomic uint64_t store_errors[IDEM_ECLASS_OTHER + 1];
	_Atomic uint64_t purged;
} idem__metrics;

void idem__metrics_init(idem__metrics *m);
void idem__metrics_destroy(idem__metrics *m);
/* outcome: an idem_outcome, or IDEM_COUNT_ERROR (0). */
void idem__metrics_count(idem__metrics *m, const char *type, int outcome);

#endif
