/*
 * core/cache.h: the front cache of completed responses (DESIGN.md §3.1).
 * Completed records are immutable until they expire, so an entry can never
 * be wrong, only absent: entries are added only from committed state and
 * die no later than their record's expires_at.
 */
#ifndef IDEM_CORE_CACHE_H
#define IDEM_CORE_CACHE_H

#include <stdatomic.h>
#include <stdint.h>

#include "store/backend.h"

typedef struct idem__cache idem__cache;

/* NULL when max_bytes or max_entries is 0 (cache off) or out of memory. */
idem__cache *idem__cache_new(size_t max_bytes, size_t max_entries);
void idem__cache_free(idem__cache *c);

/*
 * Look k up at now. On a hit fills out with REPLAY (a copy of the body) or
 * MISMATCH (fingerprint differs) and returns 1; 0 on a miss; <0 on ENOMEM.
 */
int idem__cache_get(idem__cache *c, const idem__key *k, const char *fp, int64_t now,
                    idem_result *out);

/*
 * The replay shortcut (src/pay/pipeline.c): raw is a request's raw bytes
 * (method, path and body as the caller frames them), at most
 * IDEM__CACHE_RAW_MAX. get_raw answers REPLAY (1, a copy of the body) only
 * when k's entry was noted with exactly these bytes; 0 otherwise (a miss
 * decides nothing: the caller takes the canonical path); <0 on ENOMEM.
 * note_raw keeps a copy of raw with k's entry when that entry's fingerprint
 * is fp, i.e. after the canonical path has shown that these bytes give the
 * stored fingerprint; the copy counts against the cache's byte cap.
 */
#define IDEM__CACHE_RAW_MAX 2048
int idem__cache_get_raw(idem__cache *c, const idem__key *k, const void *raw, size_t len,
                        int64_t now, idem_result *out);
void idem__cache_note_raw(idem__cache *c, const idem__key *k, const char *fp, const void *raw,
                          size_t len, int64_t now);

/* Remember a committed, completed answer for k until expires_at. */
void idem__cache_put(idem__cache *c, const idem__key *k, const char *fp, int http_status,
                     const unsigned char *body, size_t len, int64_t expires_at, int64_t now);

typedef struct {
	uint64_t hits, misses, evictions, entries, bytes;
} idem__cache_stats;

void idem__cache_stats_get(idem__cache *c, idem__cache_stats *out);

#endif
