/*
 * bench/raw-sqlite.c: the floor under idemd's SQLite write path. One thread
 * runs the writes of a first payment request, nothing else: INSERT the
 * idempotency record PROCESSING, INSERT the payment row, UPDATE the record
 * to SUCCEEDED with a response body, with --per-commit units between BEGIN
 * IMMEDIATE and COMMIT, in WAL mode with synchronous=FULL (as idemd). The
 * schema is idemd's own: run `idemctl --db sqlite:FILE demo` on the file
 * first, which creates it with a merchant and a channel to refer to.
 *
 *   raw-sqlite --db FILE [--per-commit N] [--duration SEC | --units N]
 *              [--synchronous full|normal] [--json]
 */
#include <errno.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int parse_long(const char *s, long min, long max, long *out)
{
	char *end = NULL;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

static int exec(sqlite3 *db, const char *sql)
{
	char *msg = NULL;

	if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
		fprintf(stderr, "raw-sqlite: %s: %s\n", sql, msg ? msg : sqlite3_errmsg(db));
		sqlite3_free(msg);
		return -1;
	}
	return 0;
}

static int first_text(sqlite3 *db, const char *sql, char *out, size_t outlen)
{
	sqlite3_stmt *st = NULL;
	int rc = -1;

	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
	    sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) &&
	    (size_t)sqlite3_column_bytes(st, 0) < outlen) {
		snprintf(out, outlen, "%s", (const char *)sqlite3_column_text(st, 0));
		rc = 0;
	}
	sqlite3_finalize(st);
	return rc;
}

static int step_done(sqlite3 *db, sqlite3_stmt *st)
{
	int rc = sqlite3_step(st);

	sqlite3_reset(st);
	if (rc != SQLITE_DONE) {
		fprintf(stderr, "raw-sqlite: %s\n", sqlite3_errmsg(db));
		return -1;
	}
	return 0;
}

static const char fp[] = "3f1c0a5e9b7d2468ace13579bdf02468ace13579bdf02468ace13579bdf02468";

typedef struct {
	const char *path, *sync;
	long per, units, dur_s;
	int json;
} options;

/* The open database, its three statements and what every unit refers to. */
typedef struct {
	sqlite3 *db;
	sqlite3_stmt *ins_rec, *ins_pay, *upd_rec;
	char merchant[64], channel[64], run[12];
} bench;

/* 0, or 2 after the usage or a missing --db was printed. */
static int parse_options(options *o, int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;

		if (strcmp(a, "--json") == 0) {
			o->json = 1;
			continue;
		}
		if (!v)
			bad = 1;
		else if (strcmp(a, "--db") == 0)
			o->path = v;
		else if (strcmp(a, "--per-commit") == 0)
			bad = parse_long(v, 1, 100000, &o->per);
		else if (strcmp(a, "--units") == 0)
			bad = parse_long(v, 1, 1000000000, &o->units);
		else if (strcmp(a, "--duration") == 0)
			bad = parse_long(v, 1, 3600, &o->dur_s);
		else if (strcmp(a, "--synchronous") == 0 && strcmp(v, "normal") == 0)
			o->sync = "NORMAL";
		else if (strcmp(a, "--synchronous") == 0 && strcmp(v, "full") == 0)
			o->sync = "FULL";
		else
			bad = 1;
		if (bad) {
			fprintf(stderr,
			        "usage: raw-sqlite --db FILE [--per-commit N] [--duration SEC"
			        " | --units N] [--synchronous full|normal] [--json]\n");
			return 2;
		}
		i++;
	}
	if (!o->path) {
		fprintf(stderr, "raw-sqlite: --db FILE is required\n");
		return 2;
	}
	return 0;
}

/* The file in WAL mode with idemd's pragmas, and the demo's merchant and channel. */
static int open_db(bench *b, const options *o)
{
	static const char merchant_sql[] = "SELECT id FROM merchants ORDER BY created_at LIMIT 1";
	static const char channel_sql[] = "SELECT name FROM channels LIMIT 1";
	char pragma[64];
	sqlite3 *db;

	if (sqlite3_open_v2(o->path, &b->db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
		fprintf(stderr, "raw-sqlite: cannot open %s\n", o->path);
		return -1;
	}
	db = b->db;
	snprintf(pragma, sizeof(pragma), "PRAGMA synchronous=%s", o->sync);
	sqlite3_busy_timeout(db, 5000);
	if (exec(db, "PRAGMA journal_mode=WAL") < 0 || exec(db, pragma) < 0 ||
	    exec(db, "PRAGMA foreign_keys=ON") < 0)
		return -1;
	if (first_text(db, merchant_sql, b->merchant, sizeof(b->merchant)) < 0 ||
	    first_text(db, channel_sql, b->channel, sizeof(b->channel)) < 0) {
		fprintf(stderr, "raw-sqlite: no merchant or channel: run idemctl demo first\n");
		return -1;
	}
	return 0;
}

static int prepare_statements(bench *b)
{
	if (sqlite3_prepare_v2(b->db,
	                       "INSERT INTO idem_records (scope, business_type, idem_key, version,"
	                       " status, fingerprint, owner, lease_until, created_at, expires_at)"
	                       " VALUES (?1, 'payment', ?2, 1, 'PROCESSING', ?3, ?4, ?5, ?6, ?7)",
	                       -1, &b->ins_rec, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(
	        b->db,
	        "INSERT INTO payments (id, merchant_id, merchant_order_no, amount,"
	        " currency, channel, description, metadata, status, refunded_amount,"
	        " fingerprint, created_at, updated_at)"
	        " VALUES (?1, ?2, ?3, ?4, 'CNY', ?5, NULL, NULL, 'processing', 0, ?6,"
	        " ?7, ?7)",
	        -1, &b->ins_pay, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(
	        b->db,
	        "UPDATE idem_records SET version = version + 1, status = 'SUCCEEDED',"
	        " http_status = 201, response = ?1, owner = NULL, lease_until = NULL,"
	        " completed_at = ?2 WHERE id = ?3 AND owner = ?4"
	        " AND status = 'PROCESSING'",
	        -1, &b->upd_rec, NULL) != SQLITE_OK) {
		fprintf(stderr, "raw-sqlite: prepare: %s\n", sqlite3_errmsg(b->db));
		return -1;
	}
	return 0;
}

/* Unit u: the record PROCESSING, the payment row, the record SUCCEEDED. */
static int write_unit(bench *b, uint64_t u)
{
	char key[64], id[64], owner[32], resp[512];
	int64_t now = wall_ms(), rid;
	int rlen;

	snprintf(key, sizeof(key), "raw%s-%llu", b->run, (unsigned long long)u);
	snprintf(id, sizeof(id), "pay_raw%s%016llx", b->run, (unsigned long long)u);
	snprintf(owner, sizeof(owner), "o%llu", (unsigned long long)u);
	rlen = snprintf(resp, sizeof(resp),
	                "{\"id\":\"%s\",\"object\":\"payment\",\"merchant_order_no\":"
	                "\"%s\",\"amount\":1000,\"currency\":\"CNY\",\"channel\":\"%s\","
	                "\"status\":\"processing\",\"refunded_amount\":0,\"created_at\":"
	                "\"2026-01-01T00:00:00Z\",\"updated_at\":\"2026-01-01T00:00:00Z\"}",
	                id, key, b->channel);
	if (rlen < 0 || (size_t)rlen >= sizeof(resp))
		return -1;
	sqlite3_bind_text(b->ins_rec, 1, b->merchant, -1, SQLITE_STATIC);
	sqlite3_bind_text(b->ins_rec, 2, key, -1, SQLITE_STATIC);
	sqlite3_bind_text(b->ins_rec, 3, fp, -1, SQLITE_STATIC);
	sqlite3_bind_text(b->ins_rec, 4, owner, -1, SQLITE_STATIC);
	sqlite3_bind_int64(b->ins_rec, 5, now + 30000);
	sqlite3_bind_int64(b->ins_rec, 6, now);
	sqlite3_bind_int64(b->ins_rec, 7, now + 86400000);
	if (step_done(b->db, b->ins_rec) < 0)
		return -1;
	rid = sqlite3_last_insert_rowid(b->db);
	sqlite3_bind_text(b->ins_pay, 1, id, -1, SQLITE_STATIC);
	sqlite3_bind_text(b->ins_pay, 2, b->merchant, -1, SQLITE_STATIC);
	sqlite3_bind_text(b->ins_pay, 3, key, -1, SQLITE_STATIC);
	sqlite3_bind_int64(b->ins_pay, 4, 1000);
	sqlite3_bind_text(b->ins_pay, 5, b->channel, -1, SQLITE_STATIC);
	sqlite3_bind_text(b->ins_pay, 6, fp, -1, SQLITE_STATIC);
	sqlite3_bind_int64(b->ins_pay, 7, now);
	if (step_done(b->db, b->ins_pay) < 0)
		return -1;
	sqlite3_bind_blob(b->upd_rec, 1, resp, rlen, SQLITE_STATIC);
	sqlite3_bind_int64(b->upd_rec, 2, now);
	sqlite3_bind_int64(b->upd_rec, 3, rid);
	sqlite3_bind_text(b->upd_rec, 4, owner, -1, SQLITE_STATIC);
	return step_done(b->db, b->upd_rec);
}

/* Transactions of --per-commit units until --units or the duration; the
 * units committed in *done_units. A failed unit leaves its transaction
 * open: closing the database rolls it back. */
static int run_units(bench *b, const options *o, uint64_t t0, uint64_t *done_units)
{
	uint64_t deadline = t0 + (uint64_t)o->dur_s * 1000000000u;

	for (;;) {
		if (o->units ? *done_units >= (uint64_t)o->units : now_ns() >= deadline)
			break;
		if (exec(b->db, "BEGIN IMMEDIATE") < 0)
			return -1;
		for (long k = 0; k < o->per; k++)
			if (write_unit(b, *done_units + (uint64_t)k) < 0)
				return -1;
		if (exec(b->db, "COMMIT") < 0)
			return -1;
		*done_units += (uint64_t)o->per;
	}
	return 0;
}

static void report(const options *o, uint64_t done_units, double secs)
{
	double rate = secs > 0 ? (double)done_units / secs : 0;

	if (o->json)
		printf("{\"label\":\"raw-sqlite "
		       "%ld/commit\",\"per_commit\":%ld,\"requests\":%llu,"
		       "\"seconds\":%.3f,\"rps\":%.1f}\n",
		       o->per, o->per, (unsigned long long)done_units, secs, rate);
	else
		printf("raw-sqlite: %llu units, %ld per commit, synchronous=%s, %.2f s: "
		       "%.0f/s\n",
		       (unsigned long long)done_units, o->per, o->sync, secs, rate);
}

int main(int argc, char **argv)
{
	options o = {.sync = "FULL", .per = 1, .dur_s = 5};
	bench b = {0};
	uint64_t t0, done_units = 0;
	int rc, exit_code = 1;

	if ((rc = parse_options(&o, argc, argv)) != 0)
		return rc;
	if (open_db(&b, &o) < 0 || prepare_statements(&b) < 0)
		goto done;
	snprintf(b.run, sizeof(b.run), "%llx", (unsigned long long)(now_ns() & 0xffffffffff));
	t0 = now_ns();
	if (run_units(&b, &o, t0, &done_units) < 0)
		goto done;
	report(&o, done_units, (double)(now_ns() - t0) / 1e9);
	exit_code = 0;
done:
	sqlite3_finalize(b.ins_rec);
	sqlite3_finalize(b.ins_pay);
	sqlite3_finalize(b.upd_rec);
	sqlite3_close(b.db);
	return exit_code;
}
