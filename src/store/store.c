/*
 * store/store.c: the public store calls. Picks a backend from the URL scheme
 * and forwards to its ops; owns the retry loop of idem_store_transact. Holds
 * no SQL and no dialect: those live in the backend files.
 */
#include "store/store.h"

#include <stdlib.h>
#include <string.h>

#include "core/cache.h"
#include "core/claim_internal.h"
#include "store/netdb.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/rand.h"

static const struct {
	const char *scheme; /* including the ':' */
	const idem__backend_ops *ops;
} schemes[] = {
    {"sqlite:", &idem__sqlite_ops},     {"postgresql:", &idem__postgres_ops},
    {"postgres:", &idem__postgres_ops}, {"mysql:", &idem__mariadb_ops},
    {"mariadb:", &idem__mariadb_ops},
};

const char *idem__status_name(idem__status st)
{
	switch (st) {
	case IDEM__ST_PROCESSING: return "PROCESSING";
	case IDEM__ST_SUCCEEDED: return "SUCCEEDED";
	case IDEM__ST_FAILED: return "FAILED";
	}
	return "?";
}

int idem__status_parse(const char *s, size_t len, idem__status *out)
{
	for (int st = IDEM__ST_PROCESSING; st <= IDEM__ST_FAILED; st++) {
		const char *name = idem__status_name((idem__status)st);

		if (strlen(name) == len && memcmp(name, s, len) == 0) {
			*out = (idem__status)st;
			return 0;
		}
	}
	return idem__error(IDEM_ESTORE, "unknown record status '%.*s'", (int)len, s);
}

void idem__record_clear(idem__record *rec)
{
	if (!rec)
		return;
	free(rec->body);
	memset(rec, 0, sizeof(*rec));
}

void idem__retry_backoff(int attempt)
{
	/* 1 ms doubling to 64 ms, with full jitter so racers spread out. */
	int shift = attempt < 6 ? attempt : 6;
	unsigned cap = 1000u << shift;

	idem__sleep_us(200 + idem__rand_below(cap));
}

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

int idem_store_open(idem_store **out, const char *url, const idem_store_opts *opts)
{
	idem_store_opts defaults = IDEM_STORE_OPTS_INIT;
	idem_store *s = NULL;
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
	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
		size_t n = strlen(schemes[i].scheme);

		if (strncmp(url, schemes[i].scheme, n) == 0) {
			ops = schemes[i].ops;
			target = url + n;
			break;
		}
	}
	if (!ops)
		return idem__error(
		    IDEM_EINVAL,
		    "unknown store URL scheme in '%.12s' (expected sqlite:, postgresql://,"
		    " mysql:// or mariadb://)",
		    url);
	if (!(s = calloc(1, sizeof(*s))))
		return idem__error(IDEM_ENOMEM, "out of memory");
	s->ops = ops;
	s->opts = *opts;
	if (!s->opts.clock)
		s->opts.clock = idem__clock_realtime_ms;
	idem__metrics_init(&s->metrics);
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
	return store ? store->ops->name : "";
}

int idem_store_migrate(idem_store *store, int *version_out)
{
	return store->ops->migrate(store->be, version_out);
}

int idem_store_schema_version(idem_store *store, int *out)
{
	return store->ops->schema_version(store->be, out);
}

int idem_store_schema_latest(const idem_store *store)
{
	return store->ops->schema_latest;
}

int idem_store_ping(idem_store *store)
{
	return store->ops->ping(store->be);
}

int64_t idem_store_now(const idem_store *store)
{
	return store->opts.clock(store->opts.clock_ctx);
}

int idem_store_purge(idem_store *store, int batch, int max_batches, int64_t *deleted_out)
{
	int64_t total = 0;
	int rc = 0;

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

int idem_row_int(void *ctx, const idem_value *cols, int ncols)
{
	*(int64_t *)ctx = ncols > 0 && cols[0].type == IDEM_VAL_INT ? cols[0].i : 0;
	return 1;
}

int idem_txn_exec(idem_txn *txn, const char *sql, const idem_value *params, int nparams,
                  int64_t *changes_out)
{
	if (changes_out)
		*changes_out = 0;
	return txn->store->ops->txn_exec(txn, sql, params, nparams, changes_out);
}

int idem_txn_try_exec(idem_txn *txn, const char *sql, const idem_value *params, int nparams,
                      int64_t *changes_out)
{
	const idem__backend_ops *ops = txn->store->ops;

	if (changes_out)
		*changes_out = 0;
	if (ops->txn_try_exec)
		return ops->txn_try_exec(txn, sql, params, nparams, changes_out);
	return ops->txn_exec(txn, sql, params, nparams, changes_out);
}

int idem_txn_query(idem_txn *txn, const char *sql, const idem_value *params, int nparams,
                   idem_row_fn row_fn, void *ctx)
{
	return txn->store->ops->txn_query(txn, sql, params, nparams, row_fn, ctx);
}

idem_store *idem_txn_store(idem_txn *txn)
{
	return txn->store;
}

int idem_store_query(idem_store *store, const char *sql, const idem_value *params, int nparams,
                     idem_row_fn row_fn, void *ctx)
{
	int rc = store->ops->read_query(store->be, sql, params, nparams, row_fn, ctx);

	if (rc < 0)
		idem__store_count_error(store, rc);
	return rc;
}

int idem__with_txn(idem_store *s, idem_txn_fn fn, void *ctx, idem_result *out)
{
	int rc = 0;

	for (int attempt = 0;; attempt++) {
		idem_txn *txn = NULL;

		if ((rc = s->ops->txn_begin(s->be, &txn)) == 0) {
			int ret = fn(txn, ctx);

			if (ret < 0) {
				s->ops->txn_rollback(txn);
				rc = ret;
			} else if ((rc = s->ops->txn_commit(txn)) == 0) {
				rc = ret;
			}
		}
		if (rc >= 0)
			break;
		idem_result_clear(out); /* nothing was committed: no answer either */
		if (rc != IDEM_ERETRY || attempt >= s->opts.max_retries)
			break;
		idem__retry_backoff(attempt);
	}
	return rc;
}

int idem_store_transact(idem_store *store, idem_txn_fn fn, void *ctx)
{
	int rc = idem__with_txn(store, fn, ctx, NULL);

	if (rc < 0)
		idem__store_count_error(store, rc);
	return rc < 0 ? rc : 0;
}
