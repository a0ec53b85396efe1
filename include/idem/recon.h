/*
 * idem/recon.h: importing a channel's reconciliation file: each row recorded once
 * through its (channel, channel_txn_id) claim, matched against payments.
 * NULL handle or required pointer: IDEM_EINVAL (idem/common.h).
 */
#ifndef IDEM_RECON_H
#define IDEM_RECON_H

#include <stdio.h>

#include "common.h"
#include "pay.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- reconciliation import ------------------------------------------- */

/* The longest physical line of a reconciliation file, in bytes. */
#define IDEM_RECON_LINE_MAX 4096

/* The header row a reconciliation file starts with. */
#define IDEM_RECON_HEADER                                                                          \
	"channel_txn_id,merchant_id,merchant_order_no,amount,currency,status,paid_at"

#define IDEM_RECON_OPTS_VERSION 1

/* One row that was recorded and differs from the local payment. Borrowed. */
typedef struct {
	int64_t line; /* 1-based line in the file where the row starts */
	const char *channel_txn_id;
	const char *merchant_id;
	const char *merchant_order_no;
	const char *payment_id; /* the local payment */
	const char *detail;     /* what differs: "amount 1000 != 900" */
} idem_recon_mismatch;

typedef struct {
	unsigned int version; /* IDEM_RECON_OPTS_VERSION */
	int64_t ttl_ms;       /* retention of the "recon" records (default 30 days) */
	int max_in_flight;    /* rows claimed concurrently (default 512, 1..65536) */
	/* Each may be NULL. They are called one at a time, never concurrently,
	 * possibly from a group-commit writer thread. */
	void (*on_invalid)(void *ctx, int64_t line, const char *reason);
	void (*on_mismatch)(void *ctx, const idem_recon_mismatch *m);
	/* Every few thousand rows: bytes read so far. */
	void (*on_progress)(void *ctx, int64_t bytes_read, int64_t rows);
	void *ctx;
} idem_recon_opts;

#define IDEM_RECON_OPTS_INIT                                                                       \
	{                                                                                          \
		IDEM_RECON_OPTS_VERSION, 30LL * 24 * 3600 * 1000, 512, NULL, NULL, NULL, NULL      \
	}

typedef struct {
	int64_t rows;       /* data rows read (the header excluded) */
	int64_t inserted;   /* valid rows recorded by this import */
	int64_t duplicates; /* valid rows recorded before (this file or earlier) */
	int64_t matched, mismatched, missing_local; /* inserted = their sum */
	int64_t invalid; /* rows that failed validation (on_invalid saw each) */
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
 * out:  receives the counts (also partial ones after an error).
 * opts: NULL for the defaults; pay, channel and f are required.
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
