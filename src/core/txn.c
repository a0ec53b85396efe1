/*
 * core/txn.c: running transactions on the engine's backend: the retry loop
 * every write goes through (idem__with_txn, idem_store_transact), the
 * generic SQL calls forwarded to the backend, reads on a read connection,
 * and the engine's clock. Below the claim protocol and group commit, above
 * the backend ops; it never opens or closes anything.
 */
#include "core/engine.h"

#include "util/clock.h"
#include "util/error.h"
#include "util/rand.h"

/*
 * A unit losing fast conflicts is retried past max_retries: up to
 * CONFLICT_RETRIES attempts in all, while each attempt that lost took under
 * FAST_ATTEMPT_US, and until the unit's deadline (a request's, when it has
 * one) or else CONFLICT_WINDOW_US from its first attempt.
 */
#define CONFLICT_RETRIES   32
#define FAST_ATTEMPT_US    250000
#define CONFLICT_WINDOW_US 3000000

void idem__retry_backoff(int attempt)
{
	/* 1 ms doubling to 64 ms, with full jitter so racers spread out. */
	int shift = attempt < 6 ? attempt : 6;
	unsigned cap = 1000u << shift;

	idem__sleep_us(200 + idem__rand_below(cap));
}

int64_t idem_store_now(const idem_store *store)
{
	IDEM__ASSERT_ARG(store);
	return store->opts.clock(store->opts.clock_ctx);
}

int idem_txn_exec(idem_txn *txn, const char *sql, const idem_value *params, int nparams,
                  int64_t *changes_out)
{
	IDEM__ASSERT_ARG(txn && sql && nparams >= 0 && (params || nparams == 0));
	if (changes_out)
		*changes_out = 0;
	return txn->ops->txn_exec(txn, sql, params, nparams, changes_out);
}

int idem_txn_try_exec(idem_txn *txn, const char *sql, const idem_value *params, int nparams,
                      int64_t *changes_out)
{
	const idem__backend_ops *ops = NULL;

	IDEM__ASSERT_ARG(txn && sql && nparams >= 0 && (params || nparams == 0));
	ops = txn->ops;
	if (changes_out)
		*changes_out = 0;
	if (ops->txn_try_exec)
		return ops->txn_try_exec(txn, sql, params, nparams, changes_out);
	return ops->txn_exec(txn, sql, params, nparams, changes_out);
}

int idem_txn_query(idem_txn *txn, const char *sql, const idem_value *params, int nparams,
                   idem_row_fn row_fn, void *ctx)
{
	IDEM__ASSERT_ARG(txn && sql && nparams >= 0 && (params || nparams == 0));
	return txn->ops->txn_query(txn, sql, params, nparams, row_fn, ctx);
}

idem_store *idem_txn_store(idem_txn *txn)
{
	IDEM__ASSERT_ARG_WITH_RETVAL(txn, NULL);
	return txn->store;
}

int idem_store_query(idem_store *store, const char *sql, const idem_value *params, int nparams,
                     idem_row_fn row_fn, void *ctx)
{
	int rc;

	IDEM__ASSERT_ARG(store && sql && nparams >= 0 && (params || nparams == 0));
	rc = store->ops->read_query(store->be, sql, params, nparams, row_fn, ctx);
	if (rc < 0)
		idem__store_count_error(store, rc);
	return rc;
}

/* idem__with_txn with an undo flag: fn_undo sets it to roll back and succeed. */
static int txn_loop(idem_store *s, idem_txn_fn fn, idem__txn_undo_fn fn_undo, void *ctx,
                    idem_result *out)
{
	int64_t t0 = idem__clock_monotonic_us(), deadline = idem__backend_deadline();
	int rc = 0;

	for (int attempt = 0;; attempt++) {
		int64_t began = idem__clock_monotonic_us(), now;
		idem_txn *txn = NULL;

		if ((rc = s->ops->txn_begin(s->be, &txn)) == 0) {
			int undo = 0;
			int ret = fn ? fn(txn, ctx) : fn_undo(txn, ctx, &undo);

			if (ret < 0) {
				s->ops->txn_rollback(txn);
				rc = ret;
			} else if (undo) {
				/* Nothing of fn is to remain, and that is its answer. */
				s->ops->txn_rollback(txn);
				rc = ret;
			} else if ((rc = s->ops->txn_commit(txn)) == 0) {
				rc = ret;
			}
		}
		if (rc >= 0)
			break;
		idem_result_clear(out); /* nothing was committed: no answer either */
		if (rc != IDEM_ERETRY)
			break;
		/* Past the budget, a unit that keeps losing fast conflicts (a Galera
		 * certification failure, a deadlock: milliseconds each, more on a
		 * loaded machine) is still retried while its time lasts; one whose
		 * attempts wait (a busy or lock-wait timeout: seconds each) stops at
		 * the budget. The attempt's own length tells them apart, not the
		 * time since the first: three nodes storming one merchant on a busy
		 * machine outlasted a fixed 1 s window with nothing but fast losses
		 * (galera_hot_merchant answered a refund 503 so in CI). */
		now = idem__clock_monotonic_us();
		if (attempt >= s->opts.max_retries &&
		    (attempt >= CONFLICT_RETRIES || now - began >= FAST_ATTEMPT_US ||
		     (deadline ? now >= deadline : now - t0 > CONFLICT_WINDOW_US)))
			break;
		idem__retry_backoff(attempt);
	}
	return rc;
}

int idem__with_txn(idem_store *s, idem_txn_fn fn, void *ctx, idem_result *out)
{
	return txn_loop(s, fn, NULL, ctx, out);
}

int idem__with_txn_undo(idem_store *s, idem__txn_undo_fn fn, void *ctx, idem_result *out)
{
	return txn_loop(s, NULL, fn, ctx, out);
}

int idem_store_transact(idem_store *store, idem_txn_fn fn, void *ctx)
{
	int rc;

	IDEM__ASSERT_ARG(store && fn);
	rc = idem__with_txn(store, fn, ctx, NULL);
	if (rc < 0)
		idem__store_count_error(store, rc);
	return rc < 0 ? rc : 0;
}
