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

/*
 * A pool of n slots handed out by index. take blocks until a slot is free:
 * connections are few and held for one transaction or one read at a time.
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
int idem__pool_take(idem__pool *p);
void idem__pool_give(idem__pool *p, int slot);

/*
 * Parse the whole of s[0..len) as a decimal int64 (optional sign). 0 when it
 * is one, -1 otherwise (empty, junk, a fraction, out of range).
 */
int idem__parse_int64(const char *s, size_t len, int64_t *out);

#endif
