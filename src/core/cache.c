/*
 * core/cache.c: a sharded LRU of completed responses, bounded in bytes and
 * entries. Each shard is a hash table with chaining plus an LRU list under
 * one mutex; a lookup hashes the key once, locks one shard and copies the
 * body out (entries may be evicted as soon as the lock is dropped). The
 * byte count is what the entries really hold: the entry struct, key and
 * body, a noted request's raw bytes, malloc's per-block overhead, and the
 * bucket arrays, so the cap bounds real memory, not just bodies
 * (measured: docs/benchmarks.md).
 */
#include "core/cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define SHARDS 16
/* glibc: 8 bytes of header per block, blocks rounded up to 16. */
#define MALLOC_COST(n) ((((n) + 8 + 15) / 16) * 16)

typedef struct entry {
	struct entry *hnext;       /* hash chain */
	struct entry *prev, *next; /* LRU, most recent at head */
	uint64_t hash;
	int64_t expires_at;
	int http_status;
	char fp[IDEM_FINGERPRINT_LEN + 1];
	size_t key_len, body_len, raw_len;
	unsigned char *body; /* in the same block, after key */
	unsigned char *raw;  /* a request's raw bytes that gave fp; NULL: none noted */
	char key[];          /* scope \0 type \0 key */
} entry;

typedef struct {
	pthread_mutex_t lock;
	entry **table;
	size_t nbuckets;
	entry *head, *tail;
	size_t bytes, entries;
} shard;

struct idem__cache {
	shard shards[SHARDS];
	size_t max_bytes, max_entries; /* per shard */
	int nlocks;                    /* shards whose lock is initialised: free destroys these */
	_Atomic uint64_t hits, misses, evictions;
};

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ULL;
	}
	return h;
}

/* The flat key: scope \0 type \0 key; returns its length. */
static size_t flat_key(char *out, const idem__key *k)
{
	size_t n = 0;

	memcpy(out + n, k->scope, k->scope_len);
	n += k->scope_len;
	out[n++] = '\0';
	memcpy(out + n, k->type, k->type_len);
	n += k->type_len;
	out[n++] = '\0';
	memcpy(out + n, k->key, k->key_len);
	return n + k->key_len;
}

#define FLAT_MAX (IDEM_SCOPE_MAX + IDEM_TYPE_MAX + IDEM_KEY_MAX + 2)

idem__cache *idem__cache_new(size_t max_bytes, size_t max_entries)
{
	idem__cache *c;

	if (max_bytes == 0 || max_entries == 0)
		return NULL;
	if (!(c = calloc(1, sizeof(*c))))
		return NULL;
	c->max_bytes = max_bytes / SHARDS ? max_bytes / SHARDS : 1;
	c->max_entries = max_entries / SHARDS ? max_entries / SHARDS : 1;
	for (int i = 0; i < SHARDS; i++) {
		shard *s = &c->shards[i];

		if (pthread_mutex_init(&s->lock, NULL) != 0) {
			idem__cache_free(c);
			return NULL;
		}
		c->nlocks = i + 1;
		s->nbuckets = 256;
		while (s->nbuckets < c->max_entries && s->nbuckets < (1u << 22))
			s->nbuckets *= 2;
		if (!(s->table = calloc(s->nbuckets, sizeof(entry *)))) {
			idem__cache_free(c);
			return NULL;
		}
	}
	/* The bucket arrays are part of what the cap allows. */
	{
		size_t table = MALLOC_COST(c->shards[0].nbuckets * sizeof(entry *));

		c->max_bytes = c->max_bytes > 2 * table ? c->max_bytes - table : c->max_bytes / 2;
	}
	return c;
}

void idem__cache_free(idem__cache *c)
{
	if (!c)
		return;
	for (int i = 0; i < SHARDS; i++) {
		shard *s = &c->shards[i];

		for (entry *e = s->head, *n; e; e = n) {
			n = e->next;
			free(e->raw);
			free(e);
		}
		free(s->table);
		if (i < c->nlocks)
			pthread_mutex_destroy(&s->lock);
	}
	free(c);
}

/* An entry is one block: the struct, its key and its body after the key. */
static size_t cost_of(size_t key_len, size_t body_len)
{
	return MALLOC_COST(sizeof(entry) + key_len + (body_len ? body_len : 1));
}

static size_t cost(const entry *e)
{
	return cost_of(e->key_len, e->body_len) + (e->raw ? MALLOC_COST(e->raw_len) : 0);
}

static void lru_unlink(shard *s, entry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		s->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		s->tail = e->prev;
	e->prev = e->next = NULL;
}

static void lru_push(shard *s, entry *e)
{
	e->next = s->head;
	e->prev = NULL;
	if (s->head)
		s->head->prev = e;
	s->head = e;
	if (!s->tail)
		s->tail = e;
}

/* Remove e from its shard entirely and free it. */
static void drop(shard *s, entry *e)
{
	entry **pp = &s->table[e->hash & (s->nbuckets - 1)];

	while (*pp && *pp != e)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = e->hnext;
	lru_unlink(s, e);
	s->bytes -= cost(e);
	s->entries--;
	free(e->raw);
	free(e);
}

/* Evict from the cold end until the shard is within its caps. */
static void evict(idem__cache *c, shard *s)
{
	while (s->tail && (s->bytes > c->max_bytes || s->entries > c->max_entries)) {
		drop(s, s->tail);
		atomic_fetch_add_explicit(&c->evictions, 1, memory_order_relaxed);
	}
}

static entry *find(shard *s, uint64_t h, const char *flat, size_t n)
{
	for (entry *e = s->table[h & (s->nbuckets - 1)]; e; e = e->hnext)
		if (e->hash == h && e->key_len == n && memcmp(e->key, flat, n) == 0)
			return e;
	return NULL;
}

/* k's entry at now, its shard locked in *sp (the caller unlocks), or NULL. */
static entry *lookup(idem__cache *c, const idem__key *k, int64_t now, shard **sp)
{
	char flat[FLAT_MAX];
	size_t n = flat_key(flat, k);
	uint64_t h = fnv1a(14695981039346656037ULL, flat, n);
	shard *s = &c->shards[h % SHARDS];
	entry *e;

	pthread_mutex_lock(&s->lock);
	*sp = s;
	e = find(s, h, flat, n);
	if (e && e->expires_at <= now) {
		drop(s, e);
		e = NULL;
	}
	return e;
}

/* e was noted with exactly these raw bytes. */
static int raw_is(const entry *e, const void *raw, size_t len)
{
	return e->raw && e->raw_len == len && memcmp(e->raw, raw, len) == 0;
}

/* out = REPLAY of e (a copy of its body): 1, or IDEM_ENOMEM. */
static int replay_of(const entry *e, idem_result *out)
{
	if (!(out->body = malloc(e->body_len ? e->body_len : 1)))
		return idem__error(IDEM_ENOMEM, "out of memory");
	memcpy(out->body, e->body, e->body_len);
	out->body_len = e->body_len;
	out->http_status = e->http_status;
	out->outcome = IDEM_REPLAY;
	out->expires_at_ms = e->expires_at;
	return 1;
}

int idem__cache_get_raw(idem__cache *c, const idem__key *k, const void *raw, size_t len,
                        int64_t now, idem_result *out)
{
	shard *s;
	entry *e;
	int rc = 0;

	if (!c)
		return 0;
	e = lookup(c, k, now, &s);
	/* Only equal bytes decide; anything else goes the canonical way, which counts. */
	if (e && raw_is(e, raw, len)) {
		lru_unlink(s, e);
		lru_push(s, e);
		rc = replay_of(e, out);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc == 1)
		atomic_fetch_add_explicit(&c->hits, 1, memory_order_relaxed);
	return rc;
}

void idem__cache_note_raw(idem__cache *c, const idem__key *k, const char *fp, const void *raw,
                          size_t len, int64_t now)
{
	shard *s;
	entry *e;

	if (!c || len > IDEM__CACHE_RAW_MAX)
		return;
	e = lookup(c, k, now, &s);
	if (e && strcmp(e->fp, fp) == 0 && !raw_is(e, raw, len)) {
		unsigned char *copy = malloc(len ? len : 1);

		if (copy) {
			memcpy(copy, raw, len);
			s->bytes -= cost(e);
			free(e->raw);
			e->raw = copy;
			e->raw_len = len;
			s->bytes += cost(e);
			lru_unlink(s, e);
			lru_push(s, e);
			evict(c, s);
		}
	}
	pthread_mutex_unlock(&s->lock);
}

int idem__cache_get(idem__cache *c, const idem__key *k, const char *fp, int64_t now,
                    idem_result *out)
{
	shard *s;
	entry *e;
	int rc = 0;

	if (!c)
		return 0;
	e = lookup(c, k, now, &s);
	if (e) {
		lru_unlink(s, e);
		lru_push(s, e);
		if (strcmp(e->fp, fp) != 0) {
			out->outcome = IDEM_MISMATCH;
			out->expires_at_ms = e->expires_at;
			rc = 1;
		} else {
			rc = replay_of(e, out);
		}
	}
	pthread_mutex_unlock(&s->lock);
	atomic_fetch_add_explicit(rc == 1 ? &c->hits : &c->misses, 1, memory_order_relaxed);
	return rc;
}

void idem__cache_put(idem__cache *c, const idem__key *k, const char *fp, int http_status,
                     const unsigned char *body, size_t len, int64_t expires_at, int64_t now)
{
	char flat[FLAT_MAX];
	size_t n;
	uint64_t h;
	shard *s;
	entry *e;

	if (!c || expires_at <= now)
		return;
	n = flat_key(flat, k);
	/* One body must not push a quarter of a shard out. */
	if (cost_of(n, len) > c->max_bytes / 4)
		return;
	/* One block, not three: fewer, larger chunks fragment the heap less
	 * under eviction churn (docs/benchmarks.md, the memory row). */
	if (!(e = malloc(sizeof(*e) + n + (len ? len : 1))))
		return;
	e->body = (unsigned char *)e->key + n;
	memcpy(e->key, flat, n);
	if (len)
		memcpy(e->body, body, len);
	memcpy(e->fp, fp, sizeof(e->fp));
	e->raw = NULL;
	e->raw_len = 0;
	e->key_len = n;
	e->body_len = len;
	e->http_status = http_status;
	e->expires_at = expires_at;
	e->hash = h = fnv1a(14695981039346656037ULL, flat, n);
	e->prev = e->next = NULL;
	s = &c->shards[h % SHARDS];
	pthread_mutex_lock(&s->lock);
	{
		entry *old = find(s, h, flat, n);

		if (old)
			drop(s, old);
	}
	e->hnext = s->table[h & (s->nbuckets - 1)];
	s->table[h & (s->nbuckets - 1)] = e;
	lru_push(s, e);
	s->bytes += cost(e);
	s->entries++;
	evict(c, s);
	pthread_mutex_unlock(&s->lock);
}

void idem__cache_stats_get(idem__cache *c, idem__cache_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!c)
		return;
	out->hits = atomic_load(&c->hits);
	out->misses = atomic_load(&c->misses);
	out->evictions = atomic_load(&c->evictions);
	for (int i = 0; i < SHARDS; i++) {
		pthread_mutex_lock(&c->shards[i].lock);
		out->entries += c->shards[i].entries;
		out->bytes += c->shards[i].bytes;
		pthread_mutex_unlock(&c->shards[i].lock);
	}
}
