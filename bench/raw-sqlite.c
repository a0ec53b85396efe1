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

int main(int argc, char **argv)
{
	static const char fp[] = "3f1c0a5e9b7d2468ace13579bdf02468ace13579bdf02468ace13579bdf02468";
	const char *path = NULL, *sync = "FULL";
	long per = 1, units = 0, dur_s = 5;
	int json = 0, exit_code = 1;
	char merchant[64], channel[64], pragma[64], run[12];
	sqlite3 *db = NULL;
	sqlite3_stmt *ins_rec = NULL, *ins_pay = NULL, *upd_rec = NULL;
	uint64_t t0, t1, deadline, done_units = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;

		if (strcmp(a, "--json") == 0) {
			json = 1;
			continue;
		}
		if (!v)
			bad = 1;
		else if (strcmp(a, "--db") == 0)
			path = v;
		else if (strcmp(a, "--per-commit") == 0)
			bad = parse_long(v, 1, 100000, &per);
		else if (strcmp(a, "--units") == 0)
			bad = parse_long(v, 1, 1000000000, &units);
		else if (strcmp(a, "--duration") == 0)
			bad = parse_long(v, 1, 3600, &dur_s);
		else if (strcmp(a, "--synchronous") == 0 && strcmp(v, "normal") == 0)
			sync = "NORMAL";
		else if (strcmp(a, "--synchronous") == 0 && strcmp(v, "full") == 0)
			sync = "FULL";
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
	if (!path) {
		fprintf(stderr, "raw-sqlite: --db FILE is required\n");
		return 2;
	}
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
		fprintf(stderr, "raw-sqlite: cannot open %s\n", path);
		goto done;
	}
	snprintf(pragma, sizeof(pragma), "PRAGMA synchronous=%s", sync);
	sqlite3_busy_timeout(db, 5000);
	if (exec(db, "PRAGMA journal_mode=WAL") < 0 || exec(db, pragma) < 0 ||
	    exec(db, "PRAGMA foreign_keys=ON") < 0)
		goto done;
	if (first_text(db, "SELECT id FROM merchants ORDER BY created_at LIMIT 1", merchant,
	               sizeof(merchant)) < 0 ||
	    first_text(db, "SELECT name FROM channels LIMIT 1", channel, sizeof(channel)) < 0) {
		fprintf(stderr, "raw-sqlite: no merchant or channel: run idemctl demo first\n");
		goto done;
	}
	if (sqlite3_prepare_v2(db,
	                       "INSERT INTO idem_records (scope, business_type, idem_key, version,"
	                       " status, fingerprint, owner, lease_until, created_at, expires_at)"
	                       " VALUES (?1, 'payment', ?2, 1, 'PROCESSING', ?3, ?4, ?5, ?6, ?7)",
	                       -1, &ins_rec, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(
	        db,
	        "INSERT INTO payments (id, merchant_id, merchant_order_no, amount,"
	        " currency, channel, description, metadata, status, refunded_amount,"
	        " fingerprint, created_at, updated_at)"
	        " VALUES (?1, ?2, ?3, ?4, 'CNY', ?5, NULL, NULL, 'processing', 0, ?6,"
	        " ?7, ?7)",
	        -1, &ins_pay, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(
	        db,
	        "UPDATE idem_records SET version = version + 1, status = 'SUCCEEDED',"
	        " http_status = 201, response = ?1, owner = NULL, lease_until = NULL,"
	        " completed_at = ?2 WHERE id = ?3 AND owner = ?4"
	        " AND status = 'PROCESSING'",
	        -1, &upd_rec, NULL) != SQLITE_OK) {
		fprintf(stderr, "raw-sqlite: prepare: %s\n", sqlite3_errmsg(db));
		goto done;
	}
	snprintf(run, sizeof(run), "%llx", (unsigned long long)(now_ns() & 0xffffffffff));
	t0 = now_ns();
	deadline = t0 + (uint64_t)dur_s * 1000000000u;
	for (;;) {
		if (units ? done_units >= (uint64_t)units : now_ns() >= deadline)
			break;
		if (exec(db, "BEGIN IMMEDIATE") < 0)
			goto done;
		for (long k = 0; k < per; k++) {
			char key[64], id[64], owner[32], resp[512];
			int64_t now = wall_ms();
			uint64_t u = done_units + (uint64_t)k;
			int rlen;

			snprintf(key, sizeof(key), "raw%s-%llu", run, (unsigned long long)u);
			snprintf(id, sizeof(id), "pay_raw%s%016llx", run, (unsigned long long)u);
			snprintf(owner, sizeof(owner), "o%llu", (unsigned long long)u);
			rlen = snprintf(
			    resp, sizeof(resp),
			    "{\"id\":\"%s\",\"object\":\"payment\",\"merchant_order_no\":"
			    "\"%s\",\"amount\":1000,\"currency\":\"CNY\",\"channel\":\"%s\","
			    "\"status\":\"processing\",\"refunded_amount\":0,\"created_at\":"
			    "\"2026-01-01T00:00:00Z\",\"updated_at\":\"2026-01-01T00:00:00Z\"}",
			    id, key, channel);
			if (rlen < 0 || (size_t)rlen >= sizeof(resp))
				goto done;
			sqlite3_bind_text(ins_rec, 1, merchant, -1, SQLITE_STATIC);
			sqlite3_bind_text(ins_rec, 2, key, -1, SQLITE_STATIC);
			sqlite3_bind_text(ins_rec, 3, fp, -1, SQLITE_STATIC);
			sqlite3_bind_text(ins_rec, 4, owner, -1, SQLITE_STATIC);
			sqlite3_bind_int64(ins_rec, 5, now + 30000);
			sqlite3_bind_int64(ins_rec, 6, now);
			sqlite3_bind_int64(ins_rec, 7, now + 86400000);
			if (step_done(db, ins_rec) < 0)
				goto done;
			{
				int64_t rid = sqlite3_last_insert_rowid(db);

				sqlite3_bind_text(ins_pay, 1, id, -1, SQLITE_STATIC);
				sqlite3_bind_text(ins_pay, 2, merchant, -1, SQLITE_STATIC);
				sqlite3_bind_text(ins_pay, 3, key, -1, SQLITE_STATIC);
				sqlite3_bind_int64(ins_pay, 4, 1000);
				sqlite3_bind_text(ins_pay, 5, channel, -1, SQLITE_STATIC);
				sqlite3_bind_text(ins_pay, 6, fp, -1, SQLITE_STATIC);
				sqlite3_bind_int64(ins_pay, 7, now);
				if (step_done(db, ins_pay) < 0)
					goto done;
				sqlite3_bind_blob(upd_rec, 1, resp, rlen, SQLITE_STATIC);
				sqlite3_bind_int64(upd_rec, 2, now);
				sqlite3_bind_int64(upd_rec, 3, rid);
				sqlite3_bind_text(upd_rec, 4, owner, -1, SQLITE_STATIC);
				if (step_done(db, upd_rec) < 0)
					goto done;
			}
		}
		if (exec(db, "COMMIT") < 0)
			goto done;
		done_units += (uint64_t)per;
	}
	t1 = now_ns();
	{
		double secs = (double)(t1 - t0) / 1e9,
		       rate = secs > 0 ? (double)done_units / secs : 0;

		if (json)
			printf("{\"label\":\"raw-sqlite "
			       "%ld/commit\",\"per_commit\":%ld,\"requests\":%llu,"
			       "\"seconds\":%.3f,\"rps\":%.1f}\n",
			       per, per, (unsigned long long)done_units, secs, rate);
		else
			printf("raw-sqlite: %llu units, %ld per commit, synchronous=%s, %.2f s: "
			       "%.0f/s\n",
			       (unsigned long long)done_units, per, sync, secs, rate);
	}
	exit_code = 0;
done:
	sqlite3_finalize(ins_rec);
	sqlite3_finalize(ins_pay);
	sqlite3_finalize(upd_rec);
	sqlite3_close(db);
	return exit_code;
}
