/*
 * pay/recon.c: importing a channel's reconciliation file.
 *
 * The file is streamed: a bounded line reader (IDEM_RECON_LINE_MAX) feeds
 * libcsv one physical line at a time, which is how each row learns the line
 * it started on, and a fixed pool of row slots bounds what is in flight, so
 * memory stays constant whatever the file's size. Each valid row is one unit
 * of work claimed as (channel, "recon", channel_txn_id) through
 * idem_execute_async: the claim decides "first or duplicate", never a read,
 * so a row is recorded once across this file and every earlier import,
 * also when two imports run at once. The recon_rows unique index (channel,
 * channel_txn_id) stands behind the claim (DESIGN.md §3.5): when the
 * idempotency record expired and was purged, the business row still says
 * "recorded", and the unit is rolled back and counted as a duplicate.
 * (The row's channel_txn_id decides; a row that reuses one with other
 * values is a duplicate too: the claim answers MISMATCH for it.)
 *
 * Units are queued to the group-commit writer when the store has one, so a
 * large file costs one commit per batch instead of one per row. Callbacks to
 * the caller are made under the job lock: never two at once.
 */
#include <csv.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "idem/admin.h"
#include "pay/internal.h"
#include "util/error.h"
#include "util/rand.h"

#define NCOLS          7
#define FIELD_MAX      255 /* longest value kept of one field */
#define READ_BUF       (4 * IDEM_RECON_LINE_MAX)
#define PROGRESS_EVERY 4096

enum { C_TXN, C_MERCHANT, C_ORDER, C_AMOUNT, C_CURRENCY, C_STATUS, C_PAID_AT };

static const char *const header_names[NCOLS] = {
    "channel_txn_id", "merchant_id", "merchant_order_no", "amount", "currency", "status", "paid_at",
};

typedef enum { R_NONE = 0, R_MATCHED, R_MISMATCHED, R_MISSING, R_DUPLICATE } row_result;

typedef struct job job;

/* One row in flight: its values, its claim, and what the work found. */
typedef struct {
	job *j;
	int64_t line;
	char txn[FIELD_MAX + 1], merchant[FIELD_MAX + 1], order[FIELD_MAX + 1];
	char currency[4], status[8], paid_at[FIELD_MAX + 1];
	int64_t amount;
	char fp[IDEM_FINGERPRINT_LEN + 1];
	idem_request req;
	/* Set by the work (rerun from scratch on a retry). */
	row_result result;
	char payment_id[IDEM_PAY_ID_SIZE];
	char detail[200];
} slot;

struct job {
	idem_pay *pay;
	const char *channel;
	idem_recon_opts opts;
	idem_recon_report *rep;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	slot *slots;
	int *free_slots;
	int nfree, nslots;
	int err; /* the first store error of a unit */
	idem_error err_detail;

	/* Parser state, main thread only. */
	struct csv_parser csv;
	char fields[NCOLS][FIELD_MAX + 2];
	size_t flen[NCOLS];
	int field_long[NCOLS];
	int nfields;
	const char *row_bad; /* a reason the whole row is invalid (line too long) */
	int64_t line;        /* the physical line being fed */
	int64_t row_start;   /* where the current row began, 0: none yet */
	int header_seen;
	int header_bad;
	int stop; /* a store error: read no further */
	int64_t bytes;
};

/* ---- validation --------------------------------------------------------- */

static int all_digits(const char *s, size_t n)
{
	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return 0;
	return 1;
}

static int parse_amount(const char *s, size_t n, int64_t *out)
{
	int64_t v = 0;

	/* 1..10^15 minor units, plain digits: no sign, no decimal point. */
	if (!all_digits(s, n) || n > 16)
		return 0;
	for (size_t i = 0; i < n; i++)
		v = v * 10 + (s[i] - '0');
	*out = v;
	return pay__valid_amount(v);
}

static int num_in(const char *s, int lo, int hi)
{
	int v = (s[0] - '0') * 10 + (s[1] - '0');

	return all_digits(s, 2) && v >= lo && v <= hi;
}

/* RFC 3339 (or with a space for the T): 2026-10-01T12:00:00[.123][Z|+08:00]. */
static int valid_time(const char *s, size_t n)
{
	size_t i = 19;

	if (n < 19 || !all_digits(s, 4) || s[4] != '-' || !num_in(s + 5, 1, 12) || s[7] != '-' ||
	    !num_in(s + 8, 1, 31) || (s[10] != 'T' && s[10] != ' ') || !num_in(s + 11, 0, 23) ||
	    s[13] != ':' || !num_in(s + 14, 0, 59) || s[16] != ':' || !num_in(s + 17, 0, 60))
		return 0;
	if (i < n && s[i] == '.') {
		size_t d = ++i;

		while (i < n && s[i] >= '0' && s[i] <= '9')
			i++;
		if (i == d || i - d > 9)
			return 0;
	}
	if (i == n)
		return 1;
	if (s[i] == 'Z')
		return i + 1 == n;
	if ((s[i] == '+' || s[i] == '-') && n - i == 6 && num_in(s + i + 1, 0, 23) &&
	    s[i + 3] == ':' && num_in(s + i + 4, 0, 59))
		return 1;
	return 0;
}

/* NULL when the row's fields are valid, else the reason. */
static const char *validate(job *j, int64_t *amount)
{
	const char *f[NCOLS];
	size_t n[NCOLS];

	if (j->row_bad)
		return j->row_bad;
	if (j->nfields != NCOLS)
		return "wrong column count";
	for (int i = 0; i < NCOLS; i++) {
		f[i] = j->fields[i];
		n[i] = j->field_long[i] ? FIELD_MAX + 1 : j->flen[i];
	}
	if (n[C_TXN] == 0)
		return "empty channel_txn_id";
	if (idem_key_validate(f[C_TXN], n[C_TXN]) < 0)
		return "bad channel_txn_id";
	if (n[C_MERCHANT] == 0)
		return "empty merchant_id";
	if (idem_token_validate(f[C_MERCHANT], n[C_MERCHANT], 64) < 0)
		return "bad merchant_id";
	if (n[C_ORDER] == 0)
		return "empty merchant_order_no";
	if (idem_natural_key_validate(f[C_ORDER], n[C_ORDER]) < 0)
		return "bad merchant_order_no";
	if (!parse_amount(f[C_AMOUNT], n[C_AMOUNT], amount))
		return "bad amount";
	if (n[C_CURRENCY] != 3 || !pay__valid_currency(f[C_CURRENCY]))
		return "bad currency";
	if (!((n[C_STATUS] == 7 && memcmp(f[C_STATUS], "SUCCESS", 7) == 0) ||
	      (n[C_STATUS] == 6 && memcmp(f[C_STATUS], "FAILED", 6) == 0)))
		return "bad status";
	if (n[C_PAID_AT] > 40 || memchr(f[C_PAID_AT], '\0', n[C_PAID_AT]) ||
	    !valid_time(f[C_PAID_AT], n[C_PAID_AT]))
		return "bad paid_at";
	return NULL;
}

/* ---- the unit of work ---------------------------------------------------- */

typedef struct {
	slot *s;
	int found;
	char id[IDEM_PAY_ID_SIZE];
	int64_t amount;
	char currency[8], status[32];
} local_payment;

static int payment_row(void *ctx, const idem_value *cols, int n)
{
	local_payment *p = ctx;

	if (n != 4)
		return idem__error(IDEM_ESTORE, "payment row has %d columns", n);
	pay__col_text(p->id, sizeof(p->id), &cols[0]);
	p->amount = cols[1].type == IDEM_VAL_INT ? cols[1].i : -1;
	pay__col_text(p->currency, sizeof(p->currency), &cols[2]);
	pay__col_text(p->status, sizeof(p->status), &cols[3]);
	p->found = 1;
	return 1;
}

static int exists_row(void *ctx, const idem_value *cols, int n)
{
	(void)cols;
	(void)n;
	*(int *)ctx = 1;
	return 1;
}

static int status_agrees(const char *file_status, const char *local)
{
	if (strcmp(file_status, "SUCCESS") == 0)
		return strcmp(local, "succeeded") == 0 ||
		       strcmp(local, "partially_refunded") == 0 || strcmp(local, "refunded") == 0;
	return strcmp(local, "failed") == 0;
}

static void compare(slot *s, const local_payment *p)
{
	size_t used = 0;

	s->detail[0] = '\0';
	if (!p->found) {
		s->result = R_MISSING;
		return;
	}
	snprintf(s->payment_id, sizeof(s->payment_id), "%s", p->id);
	if (p->amount != s->amount)
		used += (size_t)snprintf(s->detail + used, sizeof(s->detail) - used,
		                         "amount %lld != local %lld; ", (long long)s->amount,
		                         (long long)p->amount);
	if (used < sizeof(s->detail) && strcmp(p->currency, s->currency) != 0)
		used += (size_t)snprintf(s->detail + used, sizeof(s->detail) - used,
		                         "currency %s != local %s; ", s->currency, p->currency);
	if (used < sizeof(s->detail) && !status_agrees(s->status, p->status))
		used += (size_t)snprintf(s->detail + used, sizeof(s->detail) - used,
		                         "status %s vs local %s; ", s->status, p->status);
	if (used == 0) {
		s->result = R_MATCHED;
		return;
	}
	if (used >= sizeof(s->detail))
		used = sizeof(s->detail) - 1;
	if (used >= 2 && s->detail[used - 2] == ';')
		s->detail[used - 2] = '\0';
	s->result = R_MISMATCHED;
}

static const char *result_name(row_result r)
{
	switch (r) {
	case R_MATCHED: return "matched";
	case R_MISMATCHED: return "mismatched";
	case R_MISSING: return "missing_local";
	case R_DUPLICATE: return "duplicate";
	case R_NONE: break;
	}
	return "?";
}

static int recon_work(idem_txn *txn, void *ctx, idem_response *resp)
{
	slot *s = ctx;
	local_payment p = {0};
	idem_value q[2];
	int exists = 0;
	idem_value row[12];
	json_t *body;
	int rc;

	s->result = R_NONE;
	s->payment_id[0] = '\0';
	p.s = s;
	/* The backstop is checked with a read rather than by letting the INSERT
	 * fail: after a failed statement the unit must give up (idem_txn_exec).
	 * The read cannot race: this unit holds the row's claim, and any other
	 * import of the row waits on that claim. */
	q[0] = IDEM_V_TEXT(s->j->channel);
	q[1] = IDEM_V_TEXT(s->txn);
	rc =
	    idem_txn_query(txn, "SELECT 1 FROM recon_rows WHERE channel = ? AND channel_txn_id = ?",
	                   q, 2, exists_row, &exists);
	if (rc < 0)
		return rc;
	if (exists) {
		/* Recorded by an import whose idempotency record has been purged
		 * since: a duplicate. Keep nothing of this unit. */
		s->result = R_DUPLICATE;
		resp->persist = 0;
		return idem_response_set(resp, 200, "{\"result\":\"duplicate\"}", 22);
	}
	q[0] = IDEM_V_TEXT(s->merchant);
	q[1] = IDEM_V_TEXT(s->order);
	rc = idem_txn_query(txn,
	                    "SELECT id, amount, currency, status FROM payments"
	                    " WHERE merchant_id = ? AND merchant_order_no = ?",
	                    q, 2, payment_row, &p);
	if (rc < 0)
		return rc;
	compare(s, &p);
	row[0] = IDEM_V_TEXT(s->j->channel);
	row[1] = IDEM_V_TEXT(s->txn);
	row[2] = IDEM_V_TEXT(s->merchant);
	row[3] = IDEM_V_TEXT(s->order);
	row[4] = IDEM_V_INT(s->amount);
	row[5] = IDEM_V_TEXT(s->currency);
	row[6] = IDEM_V_TEXT(s->status);
	row[7] = IDEM_V_TEXT(s->paid_at);
	row[8] = IDEM_V_TEXT(result_name(s->result));
	row[9] = s->payment_id[0] ? IDEM_V_TEXT(s->payment_id) : IDEM_V_NULL;
	row[10] = s->detail[0] ? IDEM_V_TEXT(s->detail) : IDEM_V_NULL;
	row[11] = IDEM_V_INT(pay__now(s->j->pay));
	rc = idem_txn_exec(txn,
	                   "INSERT INTO recon_rows (channel, channel_txn_id, merchant_id,"
	                   " merchant_order_no, amount, currency, status, paid_at, result,"
	                   " payment_id, detail, imported_at)"
	                   " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
	                   row, 12, NULL);
	if (rc < 0)
		return rc;
	body = json_pack("{s:s, s:s?}", "result", result_name(s->result), "payment_id",
	                 s->payment_id[0] ? s->payment_id : NULL);
	if (!body)
		return idem__error(IDEM_ENOMEM, "out of memory");
	rc = pay__json(resp, 200, body);
	json_decref(body);
	return rc;
}

/* ---- dispatch ------------------------------------------------------------ */

static void release_slot(job *j, slot *s)
{
	j->free_slots[j->nfree++] = (int)(s - j->slots);
	pthread_cond_broadcast(&j->cond);
}

/* The import fails with rc and its detail (the first error wins); with
 * j->lock held. */
static void job_fail_locked(job *j, int rc)
{
	if (!j->err) {
		j->err = rc;
		j->err_detail = *idem_error_last();
	}
}

/* Slot s's row could not start (rc): the import stops, s is free again. */
static void abandon(job *j, slot *s, int rc)
{
	pthread_mutex_lock(&j->lock);
	job_fail_locked(j, rc);
	j->stop = 1;
	release_slot(j, s);
	pthread_mutex_unlock(&j->lock);
}

static void recon_done(void *ctx, int rc, idem_result *res)
{
	slot *s = ctx;
	job *j = s->j;
	idem_recon_report *r = j->rep;

	pthread_mutex_lock(&j->lock);
	if (rc < 0) {
		job_fail_locked(j, rc);
	} else if (res->outcome == IDEM_FIRST && s->result != R_DUPLICATE && s->result != R_NONE) {
		r->inserted++;
		if (s->result == R_MATCHED) {
			r->matched++;
		} else if (s->result == R_MISSING) {
			r->missing_local++;
		} else {
			idem_recon_mismatch m = {s->line,  s->txn,        s->merchant,
			                         s->order, s->payment_id, s->detail};

			r->mismatched++;
			if (j->opts.on_mismatch)
				j->opts.on_mismatch(j->opts.ctx, &m);
		}
	} else {
		/* REPLAY: this row again; MISMATCH: the same channel_txn_id with
		 * other values; both already recorded. IN_PROGRESS cannot happen
		 * (nothing PROCESSING is committed in atomic mode) and would mean
		 * another import holds it: recorded by that one. */
		r->duplicates++;
	}
	idem_result_clear(res);
	release_slot(j, s);
	pthread_mutex_unlock(&j->lock);
}

/*
 * The row's fingerprint. A hashing failure is an error of the import, never
 * an all-zero fingerprint that every retry of any row would match.
 */
static int fingerprint(slot *s)
{
	unsigned char md[32];
	unsigned int n = 0;
	char amount[24];
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	const char *parts[7] = {s->txn,      s->merchant, s->order,  amount,
	                        s->currency, s->status,   s->paid_at};
	int ok;

	snprintf(amount, sizeof(amount), "%lld", (long long)s->amount);
	ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) && EVP_DigestUpdate(c, "recon", 6);
	for (int i = 0; ok && i < 7; i++)
		ok = EVP_DigestUpdate(c, parts[i], strlen(parts[i]) + 1); /* with the NUL */
	ok = ok && EVP_DigestFinal_ex(c, md, &n) && n == sizeof(md);
	EVP_MD_CTX_free(c);
	if (!ok)
		return idem__error(IDEM_ENOMEM, "recon: SHA-256 of a row failed");
	idem__hex(s->fp, md, sizeof(md));
	return 0;
}

static void copy_field(char *out, size_t size, const job *j, int col)
{
	size_t n = j->flen[col] < size - 1 ? j->flen[col] : size - 1;

	memcpy(out, j->fields[col], n);
	out[n] = '\0';
}

static void dispatch(job *j, int64_t line, int64_t amount)
{
	slot *s;
	int rc;

	pthread_mutex_lock(&j->lock);
	while (j->nfree == 0 && !j->err)
		pthread_cond_wait(&j->cond, &j->lock);
	if (j->err) {
		j->stop = 1;
		pthread_mutex_unlock(&j->lock);
		return;
	}
	s = &j->slots[j->free_slots[--j->nfree]];
	pthread_mutex_unlock(&j->lock);

	s->j = j;
	s->line = line;
	copy_field(s->txn, sizeof(s->txn), j, C_TXN);
	copy_field(s->merchant, sizeof(s->merchant), j, C_MERCHANT);
	copy_field(s->order, sizeof(s->order), j, C_ORDER);
	copy_field(s->currency, sizeof(s->currency), j, C_CURRENCY);
	copy_field(s->status, sizeof(s->status), j, C_STATUS);
	copy_field(s->paid_at, sizeof(s->paid_at), j, C_PAID_AT);
	s->amount = amount;
	s->result = R_NONE;
	if ((rc = fingerprint(s)) < 0) {
		abandon(j, s, rc);
		return;
	}
	s->req = (idem_request)IDEM_REQUEST_INIT;
	s->req.scope = j->channel;
	s->req.business_type = "recon";
	s->req.key = s->txn;
	s->req.key_len = strlen(s->txn);
	s->req.fingerprint = s->fp;
	s->req.ttl_ms = j->opts.ttl_ms;
	/* The lock is not held: without group commit, done runs right here.
	 * Sharded: the row is the business of its merchant's shard (a merchant
	 * the directory does not know is matched on shard 0: missing_local). */
	{
		idem_pay *home = j->pay;

		if ((rc = pay__route(j->pay, s->merchant, &home)) < 0) {
			abandon(j, s, rc);
			return;
		}
		idem_execute_async(home->store, &s->req, recon_work, s, recon_done, s);
	}
}

/* ---- CSV callbacks --------------------------------------------------------- */

static void on_field(void *data, size_t len, void *arg)
{
	job *j = arg;
	int i = j->nfields++;

	if (i >= NCOLS)
		return;
	j->field_long[i] = len > FIELD_MAX;
	j->flen[i] = len > FIELD_MAX ? FIELD_MAX : len;
	if (j->flen[i])
		memcpy(j->fields[i], data, j->flen[i]);
	j->fields[i][j->flen[i]] = '\0';
}

static void reset_row(job *j)
{
	j->nfields = 0;
	j->row_bad = NULL;
	j->row_start = 0;
	memset(j->field_long, 0, sizeof(j->field_long));
}

static int is_header(const job *j)
{
	if (j->nfields != NCOLS)
		return 0;
	for (int i = 0; i < NCOLS; i++)
		if (j->field_long[i] || strlen(header_names[i]) != j->flen[i] ||
		    memcmp(header_names[i], j->fields[i], j->flen[i]) != 0)
			return 0;
	return 1;
}

static void on_row(int term, void *arg)
{
	job *j = arg;
	int64_t line = j->row_start ? j->row_start : j->line;
	int64_t amount = 0;
	const char *reason;

	(void)term;
	if (j->stop || j->header_bad) {
		reset_row(j);
		return;
	}
	if (!j->header_seen) {
		j->header_seen = 1;
		j->header_bad = !is_header(j);
		reset_row(j);
		return;
	}
	j->rep->rows++;
	if ((reason = validate(j, &amount)) != NULL) {
		pthread_mutex_lock(&j->lock);
		j->rep->invalid++;
		if (j->opts.on_invalid)
			j->opts.on_invalid(j->opts.ctx, line, reason);
		pthread_mutex_unlock(&j->lock);
	} else {
		dispatch(j, line, amount);
	}
	if (j->opts.on_progress && j->rep->rows % PROGRESS_EVERY == 0) {
		pthread_mutex_lock(&j->lock);
		j->opts.on_progress(j->opts.ctx, j->bytes, j->rep->rows);
		pthread_mutex_unlock(&j->lock);
	}
	reset_row(j);
}

/* ---- the line reader ---------------------------------------------------- */

typedef struct {
	FILE *f;
	char buf[READ_BUF];
	size_t pos, len;
	int eof, error;
} reader;

/*
 * The next physical line, '\n' included when present; *overlong when it is
 * longer than IDEM_RECON_LINE_MAX (its rest is skipped). 0 at the end.
 */
static size_t next_line(reader *r, const char **out, int *overlong)
{
	*overlong = 0;
	for (;;) {
		char *nl = memchr(r->buf + r->pos, '\n', r->len - r->pos);
		size_t avail = r->len - r->pos;

		if (nl) {
			size_t n = (size_t)(nl - (r->buf + r->pos)) + 1;

			*out = r->buf + r->pos;
			r->pos += n;
			if (n - 1 > IDEM_RECON_LINE_MAX) {
				*overlong = 1;
				return n;
			}
			return n;
		}
		if (avail > IDEM_RECON_LINE_MAX) {
			/* Too long: drop what we have and skip to the next newline. */
			*overlong = 1;
			*out = r->buf + r->pos;
			r->pos = r->len = 0;
			while (!r->eof) {
				r->len = fread(r->buf, 1, sizeof(r->buf), r->f);
				if (r->len == 0) {
					r->error = ferror(r->f);
					r->eof = 1;
					break;
				}
				nl = memchr(r->buf, '\n', r->len);
				if (nl) {
					r->pos = (size_t)(nl - r->buf) + 1;
					break;
				}
				r->len = 0;
			}
			return 1;
		}
		if (r->eof) {
			*out = r->buf + r->pos;
			r->pos = r->len;
			return avail;
		}
		if (r->pos > 0) {
			memmove(r->buf, r->buf + r->pos, avail);
			r->pos = 0;
			r->len = avail;
		}
		{
			size_t got = fread(r->buf + r->len, 1, sizeof(r->buf) - r->len, r->f);

			if (got == 0) {
				r->error = ferror(r->f);
				r->eof = 1;
			}
			r->len += got;
		}
	}
}

static int blank(const char *s, size_t n)
{
	return n == 0 || (n == 1 && s[0] == '\n') || (n == 2 && s[0] == '\r' && s[1] == '\n');
}

/* ---- the import -------------------------------------------------------------- */

static void wait_idle(job *j)
{
	pthread_mutex_lock(&j->lock);
	while (j->nfree < j->nslots)
		pthread_cond_wait(&j->cond, &j->lock);
	pthread_mutex_unlock(&j->lock);
}

/* The options, and that channel exists (channels live on shard 0). */
static int check_args(idem_pay *pay, const char *channel, const idem_recon_opts *opts)
{
	idem_value p[1];
	int rc, known = 0;

	if (opts->version != IDEM_RECON_OPTS_VERSION || opts->ttl_ms <= 0 ||
	    opts->max_in_flight < 1 || opts->max_in_flight > 65536)
		return idem__error(IDEM_EINVAL, "idem_recon_opts out of range");
	if (!pay__valid_channel_name(channel))
		return idem__error(IDEM_EINVAL, "unknown channel");
	p[0] = IDEM_V_TEXT(channel);
	if ((rc = idem_store_query(pay->store, "SELECT name FROM channels WHERE name = ?", p, 1,
	                           exists_row, &known)) < 0)
		return rc;
	if (!known)
		return idem__error(IDEM_EINVAL, "unknown channel '%s'", channel);
	return 0;
}

/* A job with opts->max_in_flight free slots; NULL when out of memory. */
static job *job_new(idem_pay *pay, const char *channel, const idem_recon_opts *opts,
                    idem_recon_report *out)
{
	job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->pay = pay;
	j->channel = channel;
	j->opts = *opts;
	j->rep = out;
	j->nslots = j->nfree = opts->max_in_flight;
	j->slots = calloc((size_t)j->nslots, sizeof(*j->slots));
	j->free_slots = calloc((size_t)j->nslots, sizeof(int));
	if (!j->slots || !j->free_slots || csv_init(&j->csv, 0) != 0) {
		free(j->slots);
		free(j->free_slots);
		free(j);
		return NULL;
	}
	for (int i = 0; i < j->nslots; i++)
		j->free_slots[i] = i;
	pthread_mutex_init(&j->lock, NULL);
	pthread_cond_init(&j->cond, NULL);
	return j;
}

static void job_free(job *j)
{
	csv_free(&j->csv);
	pthread_cond_destroy(&j->cond);
	pthread_mutex_destroy(&j->lock);
	free(j->slots);
	free(j->free_slots);
	free(j);
}

/* Feed r's lines to the CSV parser, whose rows start their units (on_row),
 * until the file ends or the job stops. */
static int feed(job *j, reader *r)
{
	int rc = 0;

	for (;;) {
		const char *s = NULL;
		int overlong = 0;
		size_t n = next_line(r, &s, &overlong);

		if (n == 0 || j->stop || j->header_bad)
			break;
		j->line++;
		j->bytes += (int64_t)n;
		if (j->line == 1 && !overlong && n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
			s += 3;
			n -= 3;
		}
		if (overlong) {
			/* The row this line belongs to is invalid; end it here. */
			if (!j->row_start)
				j->row_start = j->line;
			j->row_bad = "line too long";
			csv_fini(&j->csv, on_field, on_row, j);
			if (j->nfields || j->row_bad) /* fini saw an empty row: report it */
				on_row(-1, j);
			continue;
		}
		if (!j->row_start && !blank(s, n))
			j->row_start = j->line;
		if (csv_parse(&j->csv, s, n, on_field, on_row, j) != n) {
			rc = idem__error(IDEM_ENOMEM, "CSV parser: %s",
			                 csv_strerror(csv_error(&j->csv)));
			break;
		}
	}
	if (rc == 0 && !j->stop && !j->header_bad)
		csv_fini(&j->csv, on_field, on_row, j);
	return rc;
}

int idem_recon_import(idem_recon_report *out, idem_pay *pay, const char *channel, FILE *f,
                      const idem_recon_opts *opts)
{
	idem_recon_opts defaults = IDEM_RECON_OPTS_INIT;
	job *j = NULL;
	reader *r = NULL;
	int rc;

	IDEM__ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	IDEM__ASSERT_ARG(pay);
	IDEM__ASSERT_ARG(channel);
	IDEM__ASSERT_ARG(f);
	if (!opts)
		opts = &defaults;
	if ((rc = check_args(pay, channel, opts)) < 0)
		return rc;
	if (!(j = job_new(pay, channel, opts, out)) || !(r = calloc(1, sizeof(*r)))) {
		rc = idem__error(IDEM_ENOMEM, "out of memory");
		goto done;
	}
	r->f = f;
	rc = feed(j, r);
	wait_idle(j);
	if (rc == 0 && r->error)
		rc = idem__error(IDEM_ESTORE, "cannot read the reconciliation file");
	if (rc == 0 && j->err) {
		idem__error_restore(&j->err_detail);
		rc = j->err;
	}
	if (rc == 0 && (!j->header_seen || j->header_bad))
		rc =
		    idem__error(IDEM_EINVAL, "the first row must be the header " IDEM_RECON_HEADER);
	if (rc == 0 && opts->on_progress)
		opts->on_progress(opts->ctx, j->bytes, out->rows);
done:
	if (j)
		job_free(j);
	free(r);
	return rc;
}
