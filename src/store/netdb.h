/*
 * store/netdb.h: what the two server backends (postgres.c, mariadb.c) share
 * and SQLite does not need: a blocking pool of connection slots, the decoder
 * of an idem_records row, and integer parsing of driver text. Holds no SQL
 * and no driver types, so neither backend depends on the other's library.
 */
#ifndef IDEM_STORE_NETDB_H
#define IDEM_STORE_NETDB_H

#include <pthread.h>

#include "store/backend.h"

/* Writer connections per server store: units of work run on K writers. */
#define IDEM__NET_WRITERS 8

/* How long /healthz's ping may take in all (pool wait, connect, SELECT 1). */
#define IDEM__NET_PING_MS 500

/*
 * A pool of n slots handed out by index. take waits until a slot is free or
 * the deadline passes: connections are few and held for one transaction or
 * one read at a time.
 */
typedef struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int *free_slots; /* stack of free indexes */
	int nfree;
	int n;
} idem__pool;

int idem__pool_init(idem__pool *p, int n);
void idem__pool_destroy(idem__pool *p);
/* A free slot, or IDEM_EUNAVAIL once deadline_us (monotonic µs; 0: none) passed. */
int idem__pool_take(idem__pool *p, int64_t deadline_us);
void idem__pool_give(idem__pool *p, int slot);

/*
 * The deadline a call starting now works to, monotonic µs: the calling
 * thread's (idem__backend_deadline_set) or now + timeout_ms, the earlier of
 * the two; 0 when neither is set (timeout_ms <= 0 and no thread deadline).
 */
int64_t idem__net_deadline(int timeout_ms);

/*
 * Milliseconds to wait now for a call bounded by deadline_us and by cap_ms
 * from now (either may be 0: unbounded; both 0 gives -1, poll's "forever").
 * 0 when the bound has passed.
 */
int idem__net_wait_ms(int64_t deadline_us, int cap_ms);

/*
 * Parse the whole of s[0..len) as a decimal int64 (optional sign). 0 when it
 * is one, -1 otherwise (empty, junk, a fraction, out of range).
 */
int idem__parse_int64(const char *s, size_t len, int64_t *out);

#endif
