/*
 * core/engine.c: the engine handle. Opens a backend named by the URL
 * (store/backends.c knows the schemes), checks the version of its ops table,
 * and builds the engine around it: options, metrics, front cache and
 * group-commit writers. Forwards the public store calls to the backend and
 * owns the retry loops (idem_store_transact, purge). Holds no SQL and no
 * dialect: those live in src/store.
 */
#include "core/engine.h"

#include <stdlib.h>
#include <string.h>

#include "core/cache.h"
#include "core/claim_internal.h"
#include "util/clock.h"
#include "util/error.h"

static int check_opts(const idem_store_opts *o)
{
	if (o->version != IDEM_STORE_OPTS_VERSION)
		return idem__error(IDEM_EINVAL, "idem_store_opts version %u not supported",
		                   o->version);
	if (o->busy_timeout_ms < 0 || o->read_connections < 0 || o->read_connections > 64 ||
	    o->max_retries < 0 || o->max_retries > 100 || o->default_ttl_ms <= 0 ||
	    o->default_lease_ms <= 0 || o->batch_max < 0 || o->batch_max > 10000 ||
	    o->batch_wait_us < 0 || o->batch_wait_us > 1000000 || o->writers < 1 ||
	    o->queue_timeout_ms < 0 || o->writers > 64)
		return idem__error(IDEM_EINVAL, "idem_store_opts out of range");
	return 0;
}

int idem__engine_open(idem_store **out, const idem__backend_ops *ops, const char *target,
                      const idem_store_opts *opts)
{
	idem_store *s = NULL;
	int rc;

	*out = NULL;
	/* Like libgit2's odb backends: a table of another shape is refused, never called. */
	if (!ops || ops->version != IDEM__BACKEND_OPS_VERSION)
		return idem__error(IDEM_EINVAL,
		                   "store backend '%s' has ops version %d; this library needs %d",
		                   ops && ops->name ? ops->name : "?", ops ? ops->version : 0,
		                   IDEM__BACKEND_OPS_VERSION);
	if (!(s = calloc(1, sizeof(*s))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	s->ops = ops;
	s->opts = *opts;
	if (!s->opts.clock)
		s->opts.clock = idem__clock_realtime_ms;
	idem__metrics_init(&s->metrics);
	/* The backend gets the options in force, the clock filled in. */
	if ((rc = ops->open(&s->be, s, target, &s->opts)) < 0)
		goto done;
	if (s->opts.migrate && (rc = ops->migrate(s->be, NULL)) < 0)
		goto done;
	s->cache = idem__cache_new(s->opts.cache_bytes, s->opts.cache_entries);
	if (s->opts.batch_max > 1 && (rc = idem__batch_start(&s->batch, s)) < 0)
		goto done;
	*out = s;
	s = NULL;
	rc = 0;
done:
	idem_store_close(s);
	return rc;
}

int idem_store_open(idem_store **out, const char *url, const idem_store_opts *opts)
{
	idem_store_opts defaults = IDEM_STORE_OPTS_INIT;
	const idem__backend_ops *ops = NULL;
	const char *target = NULL;
	int rc;

	if (out)
		*out = NULL;
	if (!out || !url)
		return idem__error(IDEM_EINVAL, "idem_store_open: out and url are required");
	if (!opts)
		opts = &defaults;
	if ((rc = check_opts(opts)) < 0)
		return rc;
	if (!(ops = idem__backend_find(url, &target)))
		return idem__error(
		    IDEM_EINVAL,
		    "unknown store URL scheme in '%.12s' (expected sqlite:, postgresql://,"
		    " mysql:// or mariadb://)",
		    url);
	return idem__engine_open(out, ops, target, opts);
}

void idem_store_close(idem_store *store)
{
	if (!store)
		return;
	idem__batch_stop(store->batch); /* drains queued units first */
	idem__cache_free(store->cache);
	if (store->be)
		store->ops->close(store->be);
	idem__metrics_destroy(&store->metrics);
	free(store);
}

const char *idem_store_backend(const idem_store *store)
{
	IDEM__ASSERT_ARG_WITH_RETVAL(store, "");
	return store->ops->name;
}

int idem_store_migrate(idem_store *store, int *version_out)
{
	IDEM__ASSERT_ARG(store);
	return store->ops->migrate(store->be, version_out);
}

int idem_store_schema_version(idem_store *store, int *out)
{
	IDEM__ASSERT_ARG(store && out);
	return store->ops->schema_version(store->be, out);
}

int idem_store_schema_latest(const idem_store *store)
{
	IDEM__ASSERT_ARG(store);
	return store->ops->schema_latest;
}

int idem_store_ping(idem_store *store)
{
	IDEM__ASSERT_ARG(store);
	return store->ops->ping(store->be);
}

void idem_deadline_begin(const idem_store *store)
{
	int64_t d = 0;

	if (store && store->opts.request_timeout_ms > 0)
		d = idem__clock_monotonic_us() + (int64_t)store->opts.request_timeout_ms * 1000;
	idem__backend_deadline_set(d);
}

void idem_deadline_end(void)
{
	idem__backend_deadline_set(0);
}

int64_t idem_deadline_get(void)
{
	return idem__backend_deadline();
}

void idem_deadline_adopt(int64_t deadline)
{
	idem__backend_deadline_set(deadline);
}

int idem_store_purge(idem_store *store, int batch, int max_batches, int64_t *deleted_out)
{
	int64_t total = 0;
	int rc = 0;

	IDEM__ASSERT_ARG(store);
	if (batch <= 0 || batch > 100000 || max_batches < 0)
		return idem__error(IDEM_EINVAL, "purge batch must be 1..100000");
	for (int b = 0; max_batches == 0 || b < max_batches; b++) {
		int64_t n = 0;

		for (int attempt = 0;; attempt++) {
			rc = store->ops->purge_batch(store->be, idem_store_now(store), batch, &n);
			if (rc != IDEM_ERETRY || attempt >= store->opts.max_retries)
				break;
			idem__retry_backoff(attempt);
		}
		if (rc < 0) {
			idem__store_count_error(store, rc);
			break;
		}
		total += n;
		atomic_fetch_add(&store->metrics.purged, (uint64_t)n);
		if (n < batch)
			break;
	}
	if (deleted_out)
		*deleted_out = total;
	return rc;
}
