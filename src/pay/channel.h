/*
 * pay/channel.h: connected payment channels (../shared/CHANNEL.md). A
 * channel with a base URL is called over HTTP by idemd: its configuration
 * (cached for a few seconds), the client that signs requests and sorts every
 * answer into definite or unknown, the bounded pool of workers that make the
 * calls (never an HTTP thread, never a thread per request), the two-phase
 * payment and refund flows, and the sweeper that resolves what nobody came
 * back for.
 */
#ifndef IDEM_PAY_CHANNEL_H
#define IDEM_PAY_CHANNEL_H

#include <curl/curl.h>
#include <jansson.h>

#include "pay/internal.h"

/* A channel as the client needs it. The secret is the opened one. */
typedef struct {
	char name[IDEM_PAY_CHANNEL_MAX + 1];
	char base_url[512]; /* "" when the channel only receives notifications */
	char secret[IDEM_PAY_SECRET_SIZE];
	int64_t timeout_ms;
} pay__chan;

/* ---- the client (chanclient.c) ---- */

/*
 * The configuration of channel name, from a cache refreshed every few
 * seconds. *found 0 when no such channel. The caller cleanses out->secret.
 */
int pay__chan_get(idem_pay *pay, const char *name, pay__chan *out, int *found);
/* The same from memory alone, never waiting: 1 when it could say, 0 when not. */
int pay__chan_get_cached(idem_pay *pay, const char *name, pay__chan *out, int *found);
/* The same from the store, uncached (chanconfig.c). */
int pay__chan_load(idem_pay *pay, const char *name, pay__chan *out, int *found);

/* What a channel's answer means (CHANNEL.md, "Outcomes"). */
typedef enum {
	PAY__CH_OK = 0,       /* 2xx with code OK: definite */
	PAY__CH_DECLINED = 1, /* 4xx with a code: a definite refusal */
	PAY__CH_UNKNOWN = 2,  /* anything else: the call may or may not have taken effect */
} pay__ch_outcome;

#define PAY__CH_CALLS 5
typedef enum {
	PAY__CALL_CREATE,
	PAY__CALL_QUERY,
	PAY__CALL_CLOSE,
	PAY__CALL_REFUND,
	PAY__CALL_REFUND_QUERY
} pay__ch_kind;

typedef struct {
	pay__ch_outcome outcome;
	int http_status; /* 0 when no answer came */
	json_t *doc;     /* the answer's JSON (OK and DECLINED), owned */
	char code[64];   /* the answer's code member */
	char why[96];    /* UNKNOWN: what went wrong (for the log; never a secret) */
} pay__ch_reply;

/* Free r's document and zero it (a cleared reply is ready for another call). */
void pay__ch_reply_clear(pay__ch_reply *r);

/*
 * One call: method "GET" or "POST" to ch->base_url + path with body (POST;
 * NULL for GET), signed, on curl handle h (a worker's own: connections to
 * the channel are reused). Never fails: every problem is an UNKNOWN reply.
 * Counted in the channel metrics under call.
 */
void pay__ch_call(idem_pay *pay, CURL *h, const pay__chan *ch, pay__ch_kind call,
                  const char *method, const char *path, const char *body, pay__ch_reply *out);

/* ---- the pool of channel workers (chanpool.c) ---- */

typedef struct pay__job pay__job;
struct pay__job {
	void (*run)(pay__job *job, CURL *h); /* on a worker; frees job */
	pay__job *next;
	int64_t deadline; /* the submitting request's (idem_deadline_get), 0: none */
};

typedef struct pay__pool pay__pool;

/* workers threads, each with its own curl handle, and a queue of queue_max. */
int pay__pool_start(pay__pool **out, int workers, int queue_max);
/* Queue job: 0, or IDEM_ERETRY when the queue is full or the pool stopping. */
int pay__pool_submit(pay__pool *p, pay__job *job);
/* Jobs waiting for a worker (0 for no pool). */
int pay__pool_depth(pay__pool *p);
/* Run what is queued, then stop the workers and free the pool. NULL is fine. */
void pay__pool_stop(pay__pool *p);
/* pay's pool (a shard's: its router's), started on first use; NULL after an
 * error (set). */
pay__pool *pay__pool_get(idem_pay *pay);

/* ---- metrics (chanclient.c) ---- */

/* Count one call to channel by kind and outcome (idem_pay_metrics_text). */
void pay__ch_count(idem_pay *pay, const char *channel, pay__ch_kind call, pay__ch_outcome outcome);
/* Count a sweeper pass (outcome NULL) or a request it resolved, by outcome. */
void pay__sweep_count(idem_pay *pay, const char *outcome);

/* ---- the flows (chanpay.c) ---- */

/*
 * The payment id (of merchant; NULL: any) as it is now in txn, as the answer
 * with status: the one builder of the "201 with the payment" that a
 * completed channel call, a retry after the payment resolved and the
 * sweeper's settled record all store. IDEM_ENOTFOUND (resp untouched, no
 * error detail set) when there is no such payment.
 */
int pay__payment_answer(idem_pay *pay, idem_txn *txn, const char *merchant, const char *id,
                        int status, idem_response *resp);

typedef struct pay__chjob pay__chjob;

/* How one kind of two-phase channel request runs (payments, refunds). */
typedef struct {
	const char *what; /* "create call", for the 503's detail */
	pay__ch_kind call;
	const char *path;                          /* POSTed to */
	idem_work_fn prep, ok_work, declined_work; /* ctx: the pay__chjob */
	char *(*body)(const pay__chjob *j);        /* the call's body, malloc'd */
	int (*answer_valid)(const pay__ch_reply *r, const char *id);
} pay__flow;

/* One such request on its way: phase one sets id (the downstream number). */
struct pay__chjob {
	pay__job job;
	const pay__flow *flow;
	pay__op *op;
	pay__chan ch;
	char id[IDEM_PAY_ID_SIZE];
	pay__ch_reply reply;
};

/*
 * Run op in two phases on the channel pool: the claim with flow->prep's rows,
 * the call, the completion with ok_work or declined_work; an unknown answer
 * releases the claim and answers 503 channel_unavailable. A full queue is 503
 * channel_busy, nothing claimed. op->req must be set (pay__op_request).
 */
void pay__chan_start(pay__op *op, const pay__chan *ch, const pay__flow *flow);

/* Start a payment on connected channel ch (two phases on the pool). */
void pay__chan_payment_start(pay__op *op, const pay__chan *ch);

/*
 * Move payment id to the channel's order status (PENDING, SUCCESS, FAILED,
 * CLOSED) from 'creating' (or from 'processing' for a final status),
 * crediting the merchant once on SUCCESS. *changed 1 when it moved. Inside
 * txn; takes the merchant's lock for a credit.
 */
int pay__apply_order_status(idem_pay *pay, idem_txn *txn, const char *payment_id,
                            const char *status, const char *channel_txn_id, int *changed);

/* The answer to an unknown outcome: 503 channel_unavailable, not stored. */
int pay__unavailable(idem_result *res, const char *what, const char *why);
/* Refunds (refunds.c): the status move, and the POST /refunds body. */
int pay__refund_apply_status(idem_pay *pay, idem_txn *txn, const char *merchant, const char *id,
                             const char *status, const char *channel_refund_id, int *changed);
/* 201 with refund id of merchant as it stands now. */
int pay__refund_answer(idem_txn *txn, const char *merchant, const char *id, idem_response *resp);
/* Keep the channel's refusal code on refund id. */
int pay__refund_set_code(idem_txn *txn, const char *id, const char *code);
char *pay__refund_body(const char *refund_id, const char *payment_id, int64_t amount);

/* The claim key and refusal code kept on a payment or refund row. */
typedef struct {
	char key[IDEM_KEY_MAX + 1];
	char code[64];
} pay__key_code;

/*
 * Read them for row id of table ("payments" or "refunds"): 1 when the row
 * was made under req's key (a retry of that very request), 0 when not.
 */
int pay__own_row(idem_txn *txn, const char *table, const char *id, const idem_request *req,
                 pay__key_code *out);

/* Fail payment id (still 'creating') with the channel's refusal code. */
int pay__fail_payment(idem_txn *txn, const char *id, const char *code, int64_t now);

/* The stored answer of a refusal: 402 channel_declined with channel_code. */
int pay__declined_problem(idem_response *resp, const char *code);

#endif
