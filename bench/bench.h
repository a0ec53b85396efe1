/*
 * bench/bench.h: what the parts of idem-bench share. idem-bench is a
 * closed-loop load generator for idemd: a few threads, each driving several
 * persistent HTTP/1.1 connections through epoll, one request in flight per
 * connection. It never talks to anything but the loopback address it is
 * given, and it must never decide "exactly once" from its own bookkeeping
 * alone: the verdict comes from the database (SQLite) or from idemd's API.
 */
#ifndef IDEM_BENCH_H
#define IDEM_BENCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hist.h"

#define BENCH_MAX_MERCHANTS 16
#define BENCH_MAX_CONNS     4096
#define BENCH_REQ_MAX       4096          /* one request, headers and body */
#define BENCH_RESP_MAX      (1024 * 1024) /* one response */

typedef enum { REQ_PAYMENT, REQ_NOTIFICATION, REQ_REFUND, REQ_TRANSFER, REQ_NTYPES } req_type;

typedef struct {
	char id[64];                    /* m_…; empty when only the key was given */
	char key[160];                  /* sk_… */
	int64_t before;                 /* CNY balance before the run (from GET /v1/balance) */
	_Atomic int64_t expected_delta; /* what acknowledged requests must have moved */
} bench_merchant;

/* Per-key bookkeeping, one slot per key index and request type. */
enum {
	F_SENT = 1u << 0,   /* sent at least once */
	F_ACK = 1u << 1,    /* an answer with the expected 2xx status arrived */
	F_ID = 1u << 2,     /* payment id readable (set after F_ACK, release) */
	F_UNSURE = 1u << 3, /* a send ended in a transport error: may or may not exist */
	F_NSENT = 1u << 4,  /* payment: its notification was sent */
	F_NACK = 1u << 5,   /* payment: its notification was acknowledged (200) */
	F_NUNSURE = 1u << 6,
};

typedef struct {
	_Atomic unsigned flags;
	char id[48]; /* pay_… from the 201, written once by whoever set F_ACK */
} pay_slot;

typedef struct {
	_Atomic unsigned flags;
	uint64_t pay; /* refund: payment index; written before F_SENT (release) */
} key_slot;

#define SLOT_CHUNK  65536u
#define SLOT_CHUNKS 16384u

typedef struct {
	_Atomic(void *) chunks[SLOT_CHUNKS];
	size_t size;
	pthread_mutex_t lock;
} slot_table;

typedef struct {
	/* target */
	char host[256];
	int port;
	/* load */
	int concurrency, threads;
	double duration_s;
	int duration_set; /* with --requests: a time cap too */
	uint64_t requests;
	uint64_t keys;
	double dup_ratio;
	uint64_t hot_keys;
	unsigned mix[REQ_NTYPES], mix_total;
	uint64_t seed;
	char run_id[24];
	/* credentials */
	char channel[64];
	char channel_secret[160];
	char db[1024];
	char idemctl[1024];
	int nmerchants;
	bench_merchant merchants[BENCH_MAX_MERCHANTS];
	/* output */
	int json, verify, quiet;
	char label[128];
} bench_config;

typedef struct {
	req_type type;
	uint64_t idx;
	int dup;
	size_t len;
	char buf[BENCH_REQ_MAX];
} bench_req;

typedef struct {
	int index;
	uint64_t rng;
	bench_hist hist;
	uint64_t status[600];
	uint64_t transport_errors;
	uint64_t by_type[REQ_NTYPES];
	uint64_t dups;
	uint64_t last_done_ns;
} bench_thread;

typedef enum { PHASE_WARM, PHASE_MAIN } bench_phase;

typedef struct {
	bench_config cfg;
	bench_phase phase;
	slot_table pays, refunds, transfers;
	_Atomic uint64_t alloc[REQ_NTYPES]; /* next fresh key index per type */
	_Atomic uint64_t notify_next;       /* next payment index to notify */
	_Atomic uint64_t issued;            /* requests started in this phase */
	_Atomic int stop;
	_Atomic int running; /* load threads still in the phase */
	uint64_t phase_start_ns;
} bench;

/* util */
uint64_t now_ns(void);
uint64_t rng_next(uint64_t *s);
double rng_unit(uint64_t *s);
void *slot_get(slot_table *t, uint64_t idx);
int slot_table_init(slot_table *t, size_t size);
void slot_table_free(slot_table *t);

/* workload.c: which request comes next, and what an answer means */
int workload_next(bench *b, bench_thread *t, bench_req *rq);
void workload_answer(bench *b, bench_thread *t, const bench_req *rq, int status, const char *body,
                     size_t len);
void workload_lost(bench *b, const bench_req *rq);

/* engine.c: runs one phase over the connections; 0 or -1 */
int engine_run(bench *b, bench_thread *threads, int nthreads, char *err, size_t errlen);

/* http1.c: one blocking request for set-up and checks; status or -1 */
int http_simple(const char *host, int port, const char *method, const char *path, const char *auth,
                char *body, size_t bodylen);

/* creds.c: merchants and a channel via `idemctl --db URL … --json` */
int creds_create(bench_config *c, char *err, size_t errlen);

/* verify.c: exactly-once checks after the run; 0 pass, 1 fail, -1 error */
int verify_run(bench *b, char *report, size_t reportlen);
int verify_balances_before(bench *b, char *err, size_t errlen);

#endif
