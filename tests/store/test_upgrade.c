/*
 * tests/store/test_upgrade.c: a database made by an older idem, holding
 * money, upgrades in place to this library's schema and keeps working. The
 * old database is built the way that version built it (its migrations, run
 * raw on the server, and its idem_schema_version rows), then filled with a
 * merchant, a channel, a partially refunded payment with its ledger, its
 * idempotency record and a notification. Opening the store migrates it; the
 * test checks every row reads back as before (SQLite's version 4 rebuilds
 * payments, and the refund's foreign key must still hold), the stored answer
 * is intact, and new payments and refunds work on the upgraded rows.
 *
 * argv[1] names the backend: sqlite, postgres or mariadb (ctest runs
 * test_upgrade_<backend>). Server backends need db-up.sh; skipped without.
 */
#include <jansson.h>
#include <libpq-fe.h>
#include <mysql.h>
#include <openssl/evp.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/mariadb.h"
#include "store/schema.h"
#include "support.h"

/* The version the old database is left at. */
#define OLD_VERSION 3

static const char *backend;

#define KEY    "sk_00112233445566ff_0123456789abcdef0123456789abcdef0123456789abcdef"
#define T0     "1764800000000"
#define FP     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define STORED "{\"id\":\"pay_up1\",\"object\":\"payment\",\"status\":\"succeeded\"}"

/* A raw connection to the test database, outside idem. */
typedef struct {
	sqlite3 *lite;
	PGconn *pg;
	MYSQL *my;
} raw;

static void raw_open(raw *r, const char *url)
{
	memset(r, 0, sizeof(*r));
	if (strcmp(backend, "sqlite") == 0) {
		assert_int_equal(strncmp(url, "sqlite:", 7), 0);
		assert_int_equal(sqlite3_open(url + 7, &r->lite), SQLITE_OK);
	} else if (strcmp(backend, "postgres") == 0) {
		r->pg = PQconnectdb(url);
		if (PQstatus(r->pg) != CONNECTION_OK)
			fail_msg("connect: %s", PQerrorMessage(r->pg));
	} else {
		if (!(r->my = idem__mariadb_connect(url)))
			fail_msg("connect: %s", idem_error_last()->message);
	}
}

/* Run sql (one or, except on MariaDB, several statements); fail the test on error. */
static void raw_exec(raw *r, const char *sql)
{
	if (r->lite) {
		char *err = NULL;

		if (sqlite3_exec(r->lite, sql, NULL, NULL, &err) != SQLITE_OK)
			fail_msg("%.80s: %s", sql, err);
	} else if (r->pg) {
		PGresult *res = PQexec(r->pg, sql);

		if (PQresultStatus(res) != PGRES_COMMAND_OK &&
		    PQresultStatus(res) != PGRES_TUPLES_OK)
			fail_msg("%.80s: %s", sql, PQerrorMessage(r->pg));
		PQclear(res);
	} else if (mysql_query(r->my, sql) != 0) {
		fail_msg("%.80s: %s", sql, mysql_error(r->my));
	}
}

static void raw_close(raw *r)
{
	if (r->lite)
		sqlite3_close(r->lite);
	if (r->pg)
		PQfinish(r->pg);
	if (r->my)
		mysql_close(r->my);
}

/* The schema as version OLD_VERSION of this backend left it. */
static void make_old_schema(raw *r)
{
	char sql[160];

	raw_exec(r, strcmp(backend, "mariadb") == 0
	                ? "CREATE TABLE idem_schema_version (version INT NOT NULL PRIMARY KEY,"
	                  " applied_at BIGINT NOT NULL) ENGINE=InnoDB"
	                : "CREATE TABLE idem_schema_version (version INTEGER PRIMARY KEY,"
	                  " applied_at BIGINT NOT NULL)");
	for (int v = 1; v <= OLD_VERSION; v++) {
		if (strcmp(backend, "sqlite") == 0)
			raw_exec(r, idem__sqlite_migrations[v - 1]);
		else if (strcmp(backend, "postgres") == 0)
			raw_exec(r, idem__pg_migrations[v - 1]);
		else
			for (const char *const *s = idem__my_migrations[v - 1]; *s; s++)
				raw_exec(r, *s);
		snprintf(
		    sql, sizeof(sql),
		    "INSERT INTO idem_schema_version (version, applied_at) VALUES (%d, " T0 ")", v);
		raw_exec(r, sql);
	}
}

/* What an old idemd had written: constants only, so plain SQL text. */
static void fill_old_data(raw *r)
{
	unsigned char md[32];
	unsigned int mdlen = 0;
	char hex[65], sql[512];

	assert_int_equal(EVP_Digest(KEY, strlen(KEY), md, &mdlen, EVP_sha256(), NULL), 1);
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
	snprintf(sql, sizeof(sql),
	         "INSERT INTO merchants (id, name, key_id, key_digest, lock_version, created_at)"
	         " VALUES ('m_up1', 'Old Shop', '00112233445566ff', '%s', 2, " T0 ")",
	         hex);
	raw_exec(r, sql);
	raw_exec(r, "INSERT INTO channels (name, secret, created_at)"
	            " VALUES ('mock', 'old-secret', " T0 ")");
	raw_exec(r, "INSERT INTO payments (id, merchant_id, merchant_order_no, amount, currency,"
	            " channel, description, metadata, status, refunded_amount, channel_txn_id,"
	            " fingerprint, created_at, updated_at) VALUES ('pay_up1', 'm_up1', 'ORD-UP-1',"
	            " 1000, 'CNY', 'mock', 'kept', NULL, 'partially_refunded', 300, 'txn_up1', '" FP
	            "', " T0 ", " T0 ")");
	raw_exec(r, "INSERT INTO refunds (id, merchant_id, refund_request_no, payment_id, amount,"
	            " currency, reason, status, fingerprint, created_at) VALUES ('rf_up1', 'm_up1',"
	            " 'R-UP-1', 'pay_up1', 300, 'CNY', NULL, 'succeeded', '" FP "', " T0 ")");
	raw_exec(r, "INSERT INTO ledger_entries (merchant_id, currency, amount, kind, ref_id,"
	            " created_at) VALUES ('m_up1', 'CNY', 1000, 'payment', 'pay_up1', " T0 ")");
	raw_exec(r, "INSERT INTO ledger_entries (merchant_id, currency, amount, kind, ref_id,"
	            " created_at) VALUES ('m_up1', 'CNY', -300, 'refund', 'rf_up1', " T0 ")");
	raw_exec(r, "INSERT INTO balances (merchant_id, currency, amount)"
	            " VALUES ('m_up1', 'CNY', 700)");
	raw_exec(r, "INSERT INTO notifications (channel, notify_id, payment_id, channel_txn_id,"
	            " status, amount, created_at) VALUES ('mock', 'N-UP-1', 'pay_up1', 'txn_up1',"
	            " 'SUCCESS', 1000, " T0 ")");
	raw_exec(r, "INSERT INTO idem_records (scope, business_type, idem_key, version, status,"
	            " fingerprint, owner, http_status, response, lease_until, created_at,"
	            " expires_at, completed_at) VALUES ('m_up1', 'payment', 'K-UP-1', 1,"
	            " 'SUCCEEDED', '" FP "', NULL, 201, '" STORED "', NULL, " T0
	            ", 4102444800000, " T0 ")");
}

static json_t *answer(idem_result *res, int status)
{
	json_t *doc;

	assert_int_equal(res->http_status, status);
	doc = json_loadb((const char *)res->body, res->body_len, 0, NULL);
	assert_non_null(doc);
	idem_result_clear(res);
	return doc;
}

static void write_request(idem_result *res, idem_pay *pay,
                          int (*op)(idem_result *, idem_pay *, const idem_pay_request *),
                          const char *path, const char *key, const char *body)
{
	idem_pay_request rq = {.caller = "m_up1",
	                       .key = key,
	                       .key_len = strlen(key),
	                       .method = "POST",
	                       .path = path,
	                       .body = body,
	                       .body_len = strlen(body)};

	assert_int_equal(op(res, pay, &rq), 0);
}

/* The old database at url, as an old idemd left it. */
static void make_old_database(const char *url)
{
	raw r;

	raw_open(&r, url);
	make_old_schema(&r);
	fill_old_data(&r);
	raw_close(&r);
}

/* The old key still signs in; the old rows read back unchanged. */
static void old_rows_read_back(idem_pay *pay, idem_store *store)
{
	idem_result res = {0};
	idem_record_info info;
	char merchant[IDEM_PAY_ID_SIZE];
	json_t *doc;

	assert_int_equal(idem_pay_authenticate(pay, KEY, strlen(KEY), merchant), 0);
	assert_string_equal(merchant, "m_up1");
	assert_int_equal(idem_pay_get_payment(&res, pay, "m_up1", "pay_up1"), 0);
	doc = answer(&res, 200);
	assert_string_equal(json_string_value(json_object_get(doc, "status")),
	                    "partially_refunded");
	assert_int_equal(json_integer_value(json_object_get(doc, "amount")), 1000);
	assert_int_equal(json_integer_value(json_object_get(doc, "refunded_amount")), 300);
	assert_string_equal(json_string_value(json_object_get(doc, "merchant_order_no")),
	                    "ORD-UP-1");
	json_decref(doc);
	assert_int_equal(idem_record_get(&info, store, "m_up1", "payment", "K-UP-1", 6), 0);
	assert_string_equal(info.status, "SUCCEEDED");
	assert_int_equal(info.http_status, 201);
	assert_int_equal(info.body_len, strlen(STORED));
	assert_memory_equal(info.body, STORED, strlen(STORED));
	idem_record_info_clear(&info);
}

/* A refund of the old payment: under its cap, on the rebuilt table. */
static void old_payment_refunds(idem_pay *pay)
{
	idem_result res = {0};
	json_t *doc;

	write_request(
	    &res, pay, idem_pay_refund, "/v1/refunds", "K-UP-2",
	    "{\"refund_request_no\":\"R-UP-2\",\"payment_id\":\"pay_up1\",\"amount\":200}");
	doc = answer(&res, 201);
	json_decref(doc);
	write_request(
	    &res, pay, idem_pay_refund, "/v1/refunds", "K-UP-3",
	    "{\"refund_request_no\":\"R-UP-3\",\"payment_id\":\"pay_up1\",\"amount\":600}");
	doc = answer(&res, 409);
	assert_string_equal(json_string_value(json_object_get(doc, "code")),
	                    "refund_exceeds_payment");
	json_decref(doc);
	assert_int_equal(idem_pay_get_balance(&res, pay, "m_up1"), 0);
	doc = answer(&res, 200);
	assert_int_equal(json_array_size(json_object_get(doc, "available")), 1);
	assert_int_equal(json_integer_value(json_object_get(
	                     json_array_get(json_object_get(doc, "available"), 0), "amount")),
	                 500);
	json_decref(doc);
}

/* A new payment; the old order number is still taken (its fingerprint is
 * the old one's, so this is a conflict, naming the old payment). */
static void new_payments_beside_old(idem_pay *pay)
{
	idem_result res = {0};
	json_t *doc;

	write_request(&res, pay, idem_pay_create_payment, "/v1/payments", "K-UP-4",
	              "{\"merchant_order_no\":\"ORD-UP-2\",\"amount\":50,\"currency\":\"CNY\","
	              "\"channel\":\"mock\"}");
	doc = answer(&res, 201);
	json_decref(doc);
	write_request(&res, pay, idem_pay_create_payment, "/v1/payments", "K-UP-5",
	              "{\"merchant_order_no\":\"ORD-UP-1\",\"amount\":1000,\"currency\":\"CNY\","
	              "\"channel\":\"mock\"}");
	doc = answer(&res, 409);
	assert_string_equal(json_string_value(json_object_get(doc, "code")),
	                    "business_key_conflict");
	assert_string_equal(json_string_value(json_object_get(doc, "existing_id")), "pay_up1");
	json_decref(doc);
}

static int count_row(void *ctx, const idem_value *cols, int ncols)
{
	(void)cols;
	(void)ncols;
	(*(int *)ctx)++;
	return 0;
}

static int bogus_status(idem_txn *txn, void *ctx)
{
	(void)ctx;
	return idem_txn_exec(txn,
	                     "UPDATE idem_records SET status = 'DONE' WHERE idem_key = 'K-UP-1'",
	                     NULL, 0, NULL);
}

/*
 * SQLite, version 7: the CHECKs of status columns lost their IN lists (an
 * ephemeral b-tree per statement) in the schema text, and still refuse
 * what they refused; the reader connections, opened before, parse the new
 * text too (the schema cookie moved).
 */
static void sqlite_checks_without_in_lists(idem_store *store)
{
	int left = 0;

	assert_int_equal(idem_store_query(store,
	                                  "SELECT name FROM sqlite_master WHERE type = 'table' AND"
	                                  " name IN ('idem_records', 'payments', 'recon_rows',"
	                                  " 'transfer_outbox') AND (sql LIKE '%status IN (''%'"
	                                  " AND name <> 'recon_rows' OR sql LIKE '%result IN (%')",
	                                  NULL, 0, count_row, &left),
	                 0);
	assert_int_equal(left, 0);
	assert_int_equal(idem_store_transact(store, bogus_status, NULL), IDEM_ECONSTRAINT);
}

static void old_database_upgrades_with_its_money(void **state)
{
	char *url;
	idem_store *store;
	idem_pay *pay;
	int version = 0;

	(void)state;
	if (strcmp(backend, "sqlite") != 0) {
		(void)test_server_admin_url(backend);
		setenv("IDEM_TEST_URL", backend, 1);
	}
	url = test_db_url();
	make_old_database(url);

	store = test_store_open(url, NULL); /* migrates */
	assert_int_equal(idem_store_schema_version(store, &version), 0);
	assert_true(version > OLD_VERSION);
	if (strcmp(backend, "sqlite") == 0)
		sqlite_checks_without_in_lists(store);
	assert_int_equal(idem_pay_open(&pay, store, NULL), 0);
	old_rows_read_back(pay, store);
	old_payment_refunds(pay);
	new_payments_beside_old(pay);
	idem_pay_close(pay);
	idem_store_close(store);

	/* Opening again finds nothing to do. */
	store = test_store_open(url, NULL);
	assert_int_equal(idem_store_schema_version(store, &version), 0);
	assert_true(version > OLD_VERSION);
	idem_store_close(store);
	test_db_drop(url);
	free(url);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(old_database_upgrades_with_its_money),
	};

	backend = argc > 1 ? argv[1] : "sqlite";
	return cmocka_run_group_tests(tests, NULL, NULL);
}
