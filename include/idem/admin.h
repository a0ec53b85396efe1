/*
 * idem/admin.h: what operators need beside the request path: listing and
 * rotating credentials and counting what a purge would delete. The outcome
 * counters are in idem/stats.h, the reconciliation import in idem/recon.h
 * (both included here, so code written against the one header still
 * builds). idemctl is built on these calls and holds no SQL; like the rest
 * of the library nothing here prints, exits or reads the environment.
 * NULL handle, callback or required pointer: IDEM_EINVAL (idem/common.h).
 */
#ifndef IDEM_ADMIN_H
#define IDEM_ADMIN_H

#include "claim.h"
#include "common.h"
#include "pay.h"
#include "recon.h"
#include "stats.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- credentials -------------------------------------------------------- */

/* One merchant or channel, as the list calls report it. Borrowed for the call. */
typedef struct {
	const char *id;   /* merchant id ("m_…") or channel name */
	const char *name; /* merchant name; the channel name for channels */
	int64_t created_at_ms;
} idem_admin_entry;

/* Called once per entry, ordered by creation time then id. Return 0 to go on. */
typedef int (*idem_admin_entry_fn)(void *ctx, const idem_admin_entry *e);

/* Visit every merchant (never its key or digest). Returns 0 or a store error. */
IDEM_EXTERN int idem_admin_merchant_list(idem_pay *pay, idem_admin_entry_fn fn, void *ctx);

/*
 * Give merchant a new API key, printed by the caller once: only its digest is
 * stored, and the old key stops working at the commit.
 * key_out: receives "sk_…" ("" after an error). Returns 0; IDEM_ENOTFOUND for
 * no such merchant (a malformed id included); IDEM_EINVAL for a NULL one.
 */
IDEM_EXTERN int idem_admin_merchant_rotate_key(idem_pay *pay, const char *merchant_id,
                                               char key_out[IDEM_PAY_SECRET_SIZE]);

/* Visit every channel (never its secret). */
IDEM_EXTERN int idem_admin_channel_list(idem_pay *pay, idem_admin_entry_fn fn, void *ctx);

/*
 * Give channel a new signing secret (secret_out); the old one stops
 * verifying at the commit. Returns 0; IDEM_ENOTFOUND for no such channel (a
 * malformed name included); IDEM_EINVAL for a NULL one.
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

#ifdef __cplusplus
}
#endif
#endif
