/*
 * bench/raw-mariadb.c: the floor under idemd's MariaDB write path, the
 * MariaDB counterpart of pgbench's script in run.sh. N client threads, each
 * on its own Connector/C connection (READ COMMITTED, as idemd), loop over
 * one transaction per unit: INSERT the idempotency record PROCESSING,
 * INSERT the payment row, UPDATE the record to SUCCEEDED with a response
 * body, COMMIT. Prepared statements with bound parameters only. The schema
 * and a merchant and channel must exist (`idemctl --db URL demo`).
 *
 *   raw-mariadb --db mysql://user:pass@127.0.0.1:PORT/DB [--clients N]
 *               [--duration SEC] [--json]
 */
#include <errno.h>
#include <mysql.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
	char user[128], pass[128], host[128], db[128];
	unsigned port;
} my_url;

typedef struct {
	const my_url *url;
	int index;
	uint64_t deadline;
	uint64_t units;
	int failed;
	char merchant[64], channel[64];
} client;

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

static int hexval(int c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
	                              : -1;
}

/* Copies [s, e) percent-decoded into out; -1 when malformed or too long. */
static int decode(const char *s, const char *e, char *out, size_t outlen)
{
	size_t n = 0;

	for (; s < e; s++) {
		int c = (unsigned char)*s;

		if (c == '%') {
			if (e - s < 3 || hexval(s[1]) < 0 || hexval(s[2]) < 0)
				return -1;
			c = hexval(s[1]) * 16 + hexval(s[2]);
			s += 2;
		}
		if (n + 1 >= outlen)
			return -1;
		out[n++] = (char)c;
	}
	out[n] = '\0';
	return 0;
}

static int url_parse(my_url *u, const char *t)
{
	const char *at, *colon, *slash, *hp, *pc;
	char port[8];
	char *end = NULL;
	long p;

	memset(u, 0, sizeof(*u));
	if (strncmp(t, "mysql://", 8) == 0)
		t += 8;
	else if (strncmp(t, "mariadb://", 10) == 0)
		t += 10;
	else
		return -1;
	if (!(at = strrchr(t, '@')) || !(slash = strchr(at, '/')))
		return -1;
	colon = memchr(t, ':', (size_t)(at - t));
	if (decode(t, colon ? colon : at, u->user, sizeof(u->user)) < 0 ||
	    (colon && decode(colon + 1, at, u->pass, sizeof(u->pass)) < 0))
		return -1;
	hp = at + 1;
	pc = memchr(hp, ':', (size_t)(slash - hp));
	if (decode(hp, pc ? pc : slash, u->host, sizeof(u->host)) < 0 ||
	    decode(slash + 1, slash + 1 + strcspn(slash + 1, "?"), u->db, sizeof(u->db)) < 0)
		return -1;
	u->port = 3306;
	if (pc) {
		if ((size_t)(slash - pc - 1) >= sizeof(port))
			return -1;
		snprintf(port, sizeof(port), "%.*s", (int)(slash - pc - 1), pc + 1);
		errno = 0;
		p = strtol(port, &end, 10);
		if (errno || *end || p < 1 || p > 65535)
			return -1;
		u->port = (unsigned)p;
	}
	return 0;
}

static MYSQL *connect_to(const my_url *u)
{
	MYSQL *m = mysql_init(NULL);

	if (!m)
		return NULL;
	mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
	if (!mysql_real_connect(m, u->host, u->user, u->pass, u->db, u->port, NULL,
	                        CLIENT_FOUND_ROWS) ||
	    mysql_query(m, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") != 0 ||
	    mysql_autocommit(m, 0) != 0) {
		fprintf(stderr, "raw-mariadb: connect: %s\n", mysql_error(m));
		mysql_close(m);
		return NULL;
	}
	return m;
}

static MYSQL_STMT *prepare(MYSQL *m, const char *sql)
{
	MYSQL_STMT *st = mysql_stmt_init(m);

	if (st && mysql_stmt_prepare(st, sql, (unsigned long)strlen(sql)) != 0) {
		fprintf(stderr, "raw-mariadb: prepare: %s\n", mysql_stmt_error(st));
		mysql_stmt_close(st);
		st = NULL;
	}
	return st;
}

static void bind_text(MYSQL_BIND *b, const char *s, unsigned long *len)
{
	memset(b, 0, sizeof(*b));
	*len = (unsigned long)strlen(s);
	b->buffer_type = MYSQL_TYPE_STRING;
	b->buffer = (void *)s;
	b->buffer_length = *len;
	b->length = len;
}

static void bind_blob(MYSQL_BIND *b, const char *s, unsigned long *len)
{
	bind_text(b, s, len);
	b->buffer_type = MYSQL_TYPE_BLOB;
}

static void bind_int(MYSQL_BIND *b, long long *v)
{
	memset(b, 0, sizeof(*b));
	b->buffer_type = MYSQL_TYPE_LONGLONG;
	b->buffer = v;
}

static int run_stmt(MYSQL_STMT *st, MYSQL_BIND *b)
{
	if (mysql_stmt_bind_param(st, b) != 0 || mysql_stmt_execute(st) != 0) {
		fprintf(stderr, "raw-mariadb: %s\n", mysql_stmt_error(st));
		return -1;
	}
	return 0;
}

/* A client's connection and its three statements. */
typedef struct {
	MYSQL *m;
	MYSQL_STMT *ins_rec, *ins_pay, *upd_rec;
} session;

static int prepare_statements(session *s)
{
	MYSQL *m = s->m;

	s->ins_rec = prepare(m, "INSERT INTO idem_records (scope, business_type, idem_key, version,"
	                        " status, fingerprint, owner, lease_until, created_at, expires_at)"
	                        " VALUES (?, 'payment', ?, 1, 'PROCESSING', ?, ?, ?, ?, ?)");
	s->ins_pay =
	    prepare(m, "INSERT INTO payments (id, merchant_id, merchant_order_no, amount,"
	               " currency, channel, description, metadata, status, refunded_amount,"
	               " fingerprint, created_at, updated_at)"
	               " VALUES (?, ?, ?, 1000, 'CNY', ?, NULL, NULL, 'processing', 0, ?, ?, ?)");
	s->upd_rec =
	    prepare(m, "UPDATE idem_records SET version = version + 1, status = 'SUCCEEDED',"
	               " http_status = 201, response = ?, owner = NULL, lease_until = NULL,"
	               " completed_at = ? WHERE id = ? AND owner = ? AND status = 'PROCESSING'");
	return s->ins_rec && s->ins_pay && s->upd_rec ? 0 : -1;
}

/* Unit c->units in one transaction: the record PROCESSING, the payment
 * row, the record SUCCEEDED, COMMIT. */
static int write_unit(client *c, session *s, const char *run)
{
	static const char fp[] = "3f1c0a5e9b7d2468ace13579bdf02468ace13579bdf02468ace13579bdf02468";
	char key[64], id[64], owner[32], resp[600];
	unsigned long l[8];
	long long now = wall_ms(), lease = now + 30000, exp = now + 86400000, rid;
	MYSQL_BIND b[8];

	snprintf(key, sizeof(key), "raw%s-%llu", run, (unsigned long long)c->units);
	snprintf(id, sizeof(id), "pay_raw%s%012llx", run, (unsigned long long)c->units);
	snprintf(owner, sizeof(owner), "o%llu", (unsigned long long)c->units);
	snprintf(resp, sizeof(resp),
	         "{\"id\":\"%s\",\"object\":\"payment\",\"merchant_order_no\":\"%s\","
	         "\"amount\":1000,\"currency\":\"CNY\",\"channel\":\"%s\",\"status\":"
	         "\"processing\",\"refunded_amount\":0,\"created_at\":\"2026-01-01T00:00:00Z\","
	         "\"updated_at\":\"2026-01-01T00:00:00Z\"}",
	         id, key, c->channel);
	bind_text(&b[0], c->merchant, &l[0]);
	bind_text(&b[1], key, &l[1]);
	bind_text(&b[2], fp, &l[2]);
	bind_text(&b[3], owner, &l[3]);
	bind_int(&b[4], &lease);
	bind_int(&b[5], &now);
	bind_int(&b[6], &exp);
	if (run_stmt(s->ins_rec, b) < 0)
		return -1;
	rid = (long long)mysql_stmt_insert_id(s->ins_rec);
	bind_text(&b[0], id, &l[0]);
	bind_text(&b[1], c->merchant, &l[1]);
	bind_text(&b[2], key, &l[2]);
	bind_text(&b[3], c->channel, &l[3]);
	bind_text(&b[4], fp, &l[4]);
	bind_int(&b[5], &now);
	bind_int(&b[6], &now);
	if (run_stmt(s->ins_pay, b) < 0)
		return -1;
	bind_blob(&b[0], resp, &l[0]);
	bind_int(&b[1], &now);
	bind_int(&b[2], &rid);
	bind_text(&b[3], owner, &l[3]);
	if (run_stmt(s->upd_rec, b) < 0)
		return -1;
	if (mysql_commit(s->m) != 0) {
		fprintf(stderr, "raw-mariadb: commit: %s\n", mysql_error(s->m));
		return -1;
	}
	return 0;
}

/* A client thread: units until the deadline; c->failed unless it got there. */
static void *client_main(void *arg)
{
	client *c = arg;
	session s = {connect_to(c->url), NULL, NULL, NULL};
	char run[24];

	c->failed = 1;
	if (!s.m)
		return NULL;
	if (prepare_statements(&s) < 0)
		goto done;
	snprintf(run, sizeof(run), "%llx%02x", (unsigned long long)(now_ns() & 0xffffffffff),
	         c->index & 0xff);
	while (now_ns() < c->deadline) {
		if (write_unit(c, &s, run) < 0)
			goto done;
		c->units++;
	}
	c->failed = 0;
done:
	if (s.ins_rec)
		mysql_stmt_close(s.ins_rec);
	if (s.ins_pay)
		mysql_stmt_close(s.ins_pay);
	if (s.upd_rec)
		mysql_stmt_close(s.upd_rec);
	mysql_close(s.m);
	return NULL;
}

/* The first value of a one-column query into out; 0 or -1. */
static int first_text(MYSQL *m, const char *sql, char *out, size_t outlen)
{
	MYSQL_RES *r;
	MYSQL_ROW row;
	int rc = -1;

	if (mysql_query(m, sql) != 0 || !(r = mysql_store_result(m)))
		return -1;
	if ((row = mysql_fetch_row(r)) && row[0] && strlen(row[0]) < outlen) {
		snprintf(out, outlen, "%s", row[0]);
		rc = 0;
	}
	mysql_free_result(r);
	return rc;
}

typedef struct {
	const char *db;
	long clients, dur_s;
	int json;
} options;

/* 0, or -1 for the usage. */
static int parse_options(options *o, int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		char *end = NULL;
		long v;

		if (strcmp(argv[i], "--json") == 0) {
			o->json = 1;
			continue;
		}
		if (i + 1 >= argc)
			return -1;
		if (strcmp(argv[i], "--db") == 0) {
			o->db = argv[++i];
			continue;
		}
		errno = 0;
		v = strtol(argv[i + 1], &end, 10);
		if (errno || *end || v < 1)
			return -1;
		if (strcmp(argv[i], "--clients") == 0 && v <= 512)
			o->clients = v;
		else if (strcmp(argv[i], "--duration") == 0 && v <= 3600)
			o->dur_s = v;
		else
			return -1;
		i++;
	}
	return o->db ? 0 : -1;
}

/* The merchant and channel `idemctl demo` made, for every unit to refer to. */
typedef struct {
	char merchant[64], channel[64];
} demo_rows;

static int find_demo_rows(const my_url *url, demo_rows *d)
{
	static const char merchant_sql[] = "SELECT id FROM merchants ORDER BY created_at LIMIT 1";
	static const char channel_sql[] = "SELECT name FROM channels LIMIT 1";
	MYSQL *m = connect_to(url);
	int rc = -1;

	if (!m)
		return -1;
	if (first_text(m, merchant_sql, d->merchant, sizeof(d->merchant)) < 0 ||
	    first_text(m, channel_sql, d->channel, sizeof(d->channel)) < 0)
		fprintf(stderr, "raw-mariadb: no merchant or channel: run idemctl demo first\n");
	else
		rc = 0;
	mysql_close(m);
	return rc;
}

/* The clients on their threads until the deadline; the units they wrote
 * in *total, -1 when one failed or could not start. */
static int run_clients(const options *o, const my_url *url, const demo_rows *d, uint64_t t0,
                       uint64_t *total)
{
	static client cs[512];
	pthread_t tids[512];
	int started = 0, failed = 0;

	for (long i = 0; i < o->clients; i++) {
		cs[i].url = url;
		cs[i].index = (int)i;
		cs[i].deadline = t0 + (uint64_t)o->dur_s * 1000000000u;
		snprintf(cs[i].merchant, sizeof(cs[i].merchant), "%s", d->merchant);
		snprintf(cs[i].channel, sizeof(cs[i].channel), "%s", d->channel);
		if (pthread_create(&tids[i], NULL, client_main, &cs[i]) != 0)
			break;
		started++;
	}
	for (int i = 0; i < started; i++) {
		pthread_join(tids[i], NULL);
		*total += cs[i].units;
		failed += cs[i].failed;
	}
	return failed || started < o->clients ? -1 : 0;
}

int main(int argc, char **argv)
{
	options o = {.clients = 8, .dur_s = 5};
	my_url url;
	demo_rows d;
	uint64_t t0, t1, total = 0;
	double secs;
	int exit_code = 1;

	if (parse_options(&o, argc, argv) < 0 || url_parse(&url, o.db) < 0) {
		fprintf(stderr,
		        "usage: raw-mariadb --db mysql://user:pass@host:port/db [--clients N]"
		        " [--duration SEC] [--json]\n");
		return 2;
	}
	if (mysql_library_init(0, NULL, NULL) != 0)
		return 1;
	if (find_demo_rows(&url, &d) < 0)
		goto done;
	t0 = now_ns();
	if (run_clients(&o, &url, &d, t0, &total) < 0)
		goto done;
	t1 = now_ns();
	secs = (double)(t1 - t0) / 1e9;
	if (o.json)
		printf("{\"label\":\"raw-mariadb\",\"clients\":%ld,\"requests\":%llu,"
		       "\"seconds\":%.3f,\"rps\":%.1f}\n",
		       o.clients, (unsigned long long)total, secs, (double)total / secs);
	else
		printf("raw-mariadb: %llu units on %ld clients in %.2f s: %.0f/s\n",
		       (unsigned long long)total, o.clients, secs, (double)total / secs);
	exit_code = 0;
done:
	mysql_library_end();
	return exit_code;
}
