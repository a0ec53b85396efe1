/*
 * core/metrics.c: per-type outcome counters. Lookup scans the registered
 * names without a lock: a slot's name is written before ntypes is published
 * with release order, and readers load ntypes with acquire order, so every
 * name a reader can reach is complete. Beyond IDEM__METRIC_TYPES types the
 * rest are counted under "other" rather than growing without bound.
 */
#include "core/metrics.h"

#include <stdio.h>
#include <string.h>

#include "core/cache.h"
#include "core/engine.h"
#include "idem/metrics.h"

void idem__metrics_init(idem__metrics *m)
{
	memset(m, 0, sizeof(*m));
	pthread_mutex_init(&m->lock, NULL);
}

void idem__metrics_destroy(idem__metrics *m)
{
	pthread_mutex_destroy(&m->lock);
}

static idem__type_counters *find(idem__metrics *m, const char *type, int n)
{
	for (int i = 0; i < n; i++)
		if (strcmp(m->types[i].name, type) == 0)
			return &m->types[i];
	return NULL;
}

static idem__type_counters *lookup(idem__metrics *m, const char *type)
{
	int n = atomic_load_explicit(&m->ntypes, memory_order_acquire);
	idem__type_counters *tc = find(m, type, n);

	if (tc)
		return tc;
	pthread_mutex_lock(&m->lock);
	n = atomic_load_explicit(&m->ntypes, memory_order_relaxed);
	tc = find(m, type, n);
	if (!tc) {
		if (n == IDEM__METRIC_TYPES - 1 && strcmp(type, "other") != 0) {
			pthread_mutex_unlock(&m->lock);
			return lookup(m, "other");
		}
		tc = &m->types[n];
		snprintf(tc->name, sizeof(tc->name), "%s", type);
		atomic_store_explicit(&m->ntypes, n + 1, memory_order_release);
	}
	pthread_mutex_unlock(&m->lock);
	return tc;
}

void idem__metrics_count(idem__metrics *m, const char *type, int outcome)
{
	if (outcome < 0 || outcome > IDEM_OUTCOME_COUNT)
		return;
	atomic_fetch_add_explicit(&lookup(m, type)->counts[outcome], 1, memory_order_relaxed);
}

void idem_metrics_each(idem_store *store, idem_counter_fn fn, void *ctx)
{
	idem__metrics *m = NULL;
	int n;

	IDEM__ASSERT_ARG_VOID(store);
	IDEM__ASSERT_ARG_VOID(fn);
	m = &store->metrics;
	n = atomic_load_explicit(&m->ntypes, memory_order_acquire);

	for (int i = 0; i < n; i++) {
		uint64_t c[IDEM_OUTCOME_COUNT + 1];

		for (int o = 0; o <= IDEM_OUTCOME_COUNT; o++)
			c[o] = atomic_load_explicit(&m->types[i].counts[o], memory_order_relaxed);
		fn(ctx, m->types[i].name, c);
	}
}

uint64_t idem_metrics_store_errors(idem_store *store, idem_error_class cls)
{
	IDEM__ASSERT_ARG_WITH_RETVAL(store, 0);
	if ((int)cls < 0 || cls > IDEM_ECLASS_OTHER)
		return 0;
	return atomic_load(&store->metrics.store_errors[cls]);
}

void idem_metrics_cache(idem_store *store, idem_cache_stats *out)
{
	idem__cache_stats st;

	IDEM__ASSERT_ARG_VOID(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG_VOID(store);
	idem__cache_stats_get(store->cache, &st);
	out->hits = st.hits;
	out->misses = st.misses;
	out->evictions = st.evictions;
	out->entries = st.entries;
	out->bytes = st.bytes;
}

uint64_t idem_metrics_purged(idem_store *store)
{
	IDEM__ASSERT_ARG_WITH_RETVAL(store, 0);
	return atomic_load(&store->metrics.purged);
}

void idem__store_count_error(idem_store *store, int code)
{
	idem_error_class cls = idem_error_classify(code);

	if (cls != IDEM_ECLASS_NONE)
		atomic_fetch_add(&store->metrics.store_errors[cls], 1);
}
