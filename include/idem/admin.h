/*
 * idem/admin.h: what operators need beside the request path: listing and
 * rotating credentials, counting what a purge would delete, the outcome
 * counters every idemd instance flushes to the store, and importing a
 * channel's reconciliation file. idemctl is built on these calls and holds no
 * SQL; like the rest of the library nothing here prints, exits or reads the
 * environment.
 */
#ifndef IDEM_ADMIN_H
#define IDEM_ADMIN_H

#include <stdio.h>

#include "claim.h"
#include "common.h"
#include "pay.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- credentials -------------------------------------------------------- */

/* One merchant or channel, as the list calls report it. Borrowed for the call. */
typedef struct {
	const char *id;     /* merchant id ("m_…") or channel name */
	const char *name;   /* merchant name; the channel name for channels */
	int64_t created_at_ms;
} idem_admin_entry;

/* Called once per entry, ordered by creation time then id. Return 0 to go on. */
typedef int (*idem_admin_entry_fn)(void *ctx, const idem_admin_entry *e);

/* Visit every merchant (never its key or digest). Returns 0 or a store error. */
IDEM_EXTERN int idem_admin_merchant_list(idem_pay *pay, idem_admin_entry_fn fn, void *ctx);

/*
 * Give merchant a new API key, printed by the caller once: only its digest is
 * stored, and the old key stops working at the commit.
 * key_out: receives "sk_…". Returns 0; IDEM_ENOTFOUND for no such merchant.
 */
IDEM_EXTERN int idem_admin_merchant_rotate_key(idem_pay *pay, const char *merchant_id,
					       char key_out[IDEM_PAY_SECRET_SIZE]);

/* Visit every channel (never its secret). */
IDEM_EXTERN int idem_admin_channel_list(idem_pay *pay, idem_admin_entry_fn fn, void *ctx);

/*
 * Give channel a new signing secret (secret_out); the old one stops
 * verifying at the commit. Returns 0; IDEM_ENOTFOUND for no such channel.
 */
IDEM_EXTERN int idem_admin_channel_rotate_secret(idem_pay *pay, const char *channel,
						 char secret_out[IDEM_PAY_SECRET_SIZE]);

/*
 * Seal every channel secret again in one transaction: plain ones and ones
 * sealed with the current key (idem_pay_set_secret_key) are sealed with
 * new_key (NULL: the current key, which encrypts plain secrets in place),
 * which then becomes the handle's key. changed_out (may be NULL): rows
 * written. IDEM_EINVAL without a current key, or when a secret does not
 * open with it.
 */
IDEM_EXTERN int idem_admin_channel_rekey(idem_pay *pay, const unsigned char *new_key,
					 int64_t *changed_out);

/* ---- purge -------------------------------------------------------------- */

/*
 * The number of records idem_store_purge would delete now: expired, and not
 * PROCESSING under a live lease. Reads only (a dry run). out receives it.
 */
IDEM_EXTERN int idem_admin_purge_count(idem_store *store, int64_t *out);

/* ---- stats ------------------------------------------------------------- */

typedef struct idem_stats_flusher idem_stats_flusher;

#define IDEM_STATS_FLUSHER_OPTS_VERSION 1

typedef struct {
	unsigned int version;  /* IDEM_STATS_FLUSHER_OPTS_VERSION */
	int interval_ms;       /* time between flushes (default 5000; 50..3600000) */
} idem_stats_flusher_opts;

#define IDEM_STATS_FLUSHER_OPTS_INIT { IDEM_STATS_FLUSHER_OPTS_VERSION, 5000 }

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

/* The instance id rows are written under ("i_" + 16 hex). Borrowed. */
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
	int64_t requests;    /* claims in the window: first + replay + in_progress + mismatch */
	int64_t duplicates;  /* replay + in_progress + mismatch */
	int64_t errors;      /* claims that ended in a store error */
	int instances;       /* distinct idemd instances that flushed in the window */
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

IDEM_EXTERN void idem_stats_report_clear(idem_stats_report *r);

/*
 * Delete flushed counters whose interval ended more than keep_ms ago, so
 * the stats table does not grow for ever (idemctl purge calls it).
 * deleted_out (may be NULL) receives the number of rows deleted.
 * Returns 0, IDEM_EINVAL (keep_ms <= 0), a store error.
 */
IDEM_EXTERN int idem_stats_prune(idem_store *store, int64_t keep_ms, int64_t *deleted_out);

/* ---- reconciliation import ------------------------------------------- */

/* The longest physical line of a reconciliation file, in bytes. */
#define IDEM_RECON_LINE_MAX 4096

/* The header row a reconciliation file starts with. */
#define IDEM_RECON_HEADER \
	"channel_txn_id,merchant_id,merchant_order_no,amount,currency,status,paid_at"

#define IDEM_RECON_OPTS_VERSION 1

/* One row that was recorded and differs from the local payment. Borrowed. */
typedef struct {
	int64_t line;            /* 1-based line in the file where the row starts */
	const char *channel_txn_id;
	const char *merchant_id;
	const char *merchant_order_no;
	const char *payment_id;  /* the local payment */
	const char *detail;      /* what differs: "amount 1000 != 900" */
} idem_recon_mismatch;

typedef struct {
	unsigned int version;  /* IDEM_RECON_OPTS_VERSION */
	int64_t ttl_ms;        /* retention of the "recon" records (default 30 days) */
	int max_in_flight;     /* rows claimed concurrently (default 512, 1..65536) */
	/* Each may be NULL. They are called one at a time, never concurrently,
	 * possibly from a group-commit writer thread. */
	void (*on_invalid)(void *ctx, int64_t line, const char *reason);
	void (*on_mismatch)(void *ctx, const idem_recon_mismatch *m);
	/* Every few thousand rows: bytes read so far. */
	void (*on_progress)(void *ctx, int64_t bytes_read, int64_t rows);
	void *ctx;
} idem_recon_opts;

#define IDEM_RECON_OPTS_INIT { IDEM_RECON_OPTS_VERSION, 30LL * 24 * 3600 * 1000, 512, \
			       NULL, NULL, NULL, NULL }

typedef struct {
	int64_t rows;          /* data rows read (the header excluded) */
	int64_t inserted;      /* valid rows recorded by this import */
	int64_t duplicates;    /* valid rows recorded before (this file or earlier) */
	int64_t matched, mismatched, missing_local; /* inserted = their sum */
	int64_t invalid;       /* rows that failed validation (on_invalid saw each) */
} idem_recon_report;

/*
 * Import a channel's reconciliation CSV from f, streamed in constant memory
 * (lines of at most IDEM_RECON_LINE_MAX bytes). The first row must be
 * IDEM_RECON_HEADER (a UTF-8 BOM before it is skipped). Each valid row is
 * claimed as (scope channel, business type "recon", key channel_txn_id),
 * so it is recorded once however often it appears, in this file or in
 * earlier imports; the recon_rows unique index (channel, channel_txn_id) is
 * the backstop. Each newly recorded row is compared with the merchant's
 * payment of that order number: matched (amount, currency, and SUCCESS with
 * succeeded/partially_refunded/refunded or FAILED with failed), mismatched,
 * or missing_local.
 * out: receives the counts (also partial ones after an error).
 * Returns 0; IDEM_EINVAL for a bad header or an unknown channel (nothing
 * imported); IDEM_ESTORE on a read error of f; a store error (rows counted
 * so far stay recorded: importing again completes the file).
 */
IDEM_EXTERN int idem_recon_import(idem_recon_report *out, idem_pay *pay, const char *channel,
				  FILE *f, const idem_recon_opts *opts);

#ifdef __cplusplus
}
#endif
#endif
