/*
 * store/schema_mariadb.c: the MariaDB schema, a NULL-terminated list of
 * statements per version (the payment domain's tables with it), and the
 * purge statement. Statement text only; mariadb.c runs it. A new version is
 * appended here, never edited in place, and IDEM__MY_SCHEMA_LATEST
 * (schema.h) bumped with it.
 */
#include <stddef.h>

#include "store/schema.h"

/*
 * DDL commits implicitly in MariaDB, so a version is applied statement by
 * statement and recorded after it succeeded; each statement is written to be
 * rerun (IF NOT EXISTS) after a migration that died half way.
 */
static const char *const migration_1[] = {
    "CREATE TABLE IF NOT EXISTS idem_records ("
    " id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,"
    " scope VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL"
    "  CHECK (CHAR_LENGTH(scope) BETWEEN 1 AND 128),"
    " business_type VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL"
    "  CHECK (CHAR_LENGTH(business_type) BETWEEN 1 AND 64),"
    " idem_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL"
    "  CHECK (CHAR_LENGTH(idem_key) BETWEEN 1 AND 255),"
    " version BIGINT NOT NULL,"
    " status VARCHAR(16) NOT NULL CHECK (status IN ('PROCESSING','SUCCEEDED','FAILED')),"
    " fingerprint VARCHAR(64) NOT NULL,"
    " owner VARCHAR(64) NULL,"
    " http_status INT NULL,"
    " response LONGBLOB NULL,"
    " lease_until BIGINT NULL,"
    " created_at BIGINT NOT NULL,"
    " expires_at BIGINT NOT NULL,"
    " completed_at BIGINT NULL,"
    " UNIQUE KEY idem_records_key (scope, business_type, idem_key),"
    " KEY idem_records_expiry (expires_at)"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    NULL,
};

/*
 * 2: the payment domain (src/pay), as sqlite.c's migration 2. Identifiers
 * are bounded VARCHARs (a key needs a length here): generated ids are 36
 * bytes, natural keys at most 64, channel names 32. utf8mb4_nopad_bin
 * throughout, so business unique keys compare byte for byte as well.
 */
#define PAY_TABLE " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin"

static const char *const migration_2[] = {
    "CREATE TABLE IF NOT EXISTS merchants ("
    " id VARCHAR(64) NOT NULL PRIMARY KEY,"
    " name VARCHAR(255) NOT NULL,"
    " key_id VARCHAR(64) NOT NULL UNIQUE,"
    " key_digest VARCHAR(128) NOT NULL,"
    " lock_version BIGINT NOT NULL DEFAULT 0,"
    " created_at BIGINT NOT NULL"
    ")" PAY_TABLE,
    "CREATE TABLE IF NOT EXISTS channels ("
    " name VARCHAR(64) NOT NULL PRIMARY KEY,"
    " secret VARCHAR(255) NOT NULL,"
    " created_at BIGINT NOT NULL"
    ")" PAY_TABLE,
    "CREATE TABLE IF NOT EXISTS payments ("
    " id VARCHAR(64) NOT NULL PRIMARY KEY,"
    " merchant_id VARCHAR(64) NOT NULL,"
    " merchant_order_no VARCHAR(128) NOT NULL,"
    " amount BIGINT NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000000),"
    " currency VARCHAR(8) NOT NULL CHECK (CHAR_LENGTH(currency) = 3),"
    " channel VARCHAR(64) NOT NULL,"
    " description TEXT NULL,"
    " metadata MEDIUMTEXT NULL,"
    " status VARCHAR(32) NOT NULL CHECK (status IN ('processing','succeeded','failed',"
    "  'partially_refunded','refunded')),"
    " refunded_amount BIGINT NOT NULL,"
    " channel_txn_id VARCHAR(255) NULL,"
    " fingerprint VARCHAR(64) NOT NULL,"
    " created_at BIGINT NOT NULL,"
    " updated_at BIGINT NOT NULL,"
    " CONSTRAINT payments_refunded CHECK (refunded_amount BETWEEN 0 AND amount),"
    " UNIQUE KEY payments_order (merchant_id, merchant_order_no),"
    " FOREIGN KEY (merchant_id) REFERENCES merchants (id),"
    " FOREIGN KEY (channel) REFERENCES channels (name)"
    ")" PAY_TABLE,
    "CREATE TABLE IF NOT EXISTS refunds ("
    " id VARCHAR(64) NOT NULL PRIMARY KEY,"
    " merchant_id VARCHAR(64) NOT NULL,"
    " refund_request_no VARCHAR(128) NOT NULL,"
    " payment_id VARCHAR(64) NOT NULL,"
    " amount BIGINT NOT NULL CHECK (amount > 0),"
    " currency VARCHAR(8) NOT NULL,"
    " reason TEXT NULL,"
    " status VARCHAR(32) NOT NULL,"
    " fingerprint VARCHAR(64) NOT NULL,"
    " created_at BIGINT NOT NULL,"
    " UNIQUE KEY refunds_request (merchant_id, refund_request_no),"
    " FOREIGN KEY (merchant_id) REFERENCES merchants (id),"
    " FOREIGN KEY (payment_id) REFERENCES payments (id)"
    ")" PAY_TABLE,
    "CREATE TABLE IF NOT EXISTS transfers ("
    " id VARCHAR(64) NOT NULL PRIMARY KEY,"
    " transfer_no VARCHAR(128) NOT NULL,"
    " from_merchant VARCHAR(64) NOT NULL,"
    " to_merchant VARCHAR(64) NOT NULL,"
    " amount BIGINT NOT NULL CHECK (amount > 0),"
    " currency VARCHAR(8) NOT NULL,"
    " status VARCHAR(32) NOT NULL,"
    " fingerprint VARCHAR(64) NOT NULL,"
    " created_at BIGINT NOT NULL,"
    " UNIQUE KEY transfers_no (from_merchant, transfer_no),"
    " FOREIGN KEY (from_merchant) REFERENCES merchants (id),"
    " FOREIGN KEY (to_merchant) REFERENCES merchants (id)"
    ")" PAY_TABLE,
    "CREATE TABLE IF NOT EXISTS notifications ("
    " channel VARCHAR(64) NOT NULL,"
    " notify_id VARCHAR(128) NOT NULL,"
    " payment_id VARCHAR(64) NOT NULL,"
    " channel_txn_id VARCHAR(255) NOT NULL,"
    " status VARCHAR(32) NOT NULL,"
    " amount BIGINT NOT NULL,"
    " created_at BIGINT NOT NULL,"
    " UNIQUE KEY notifications_id (channel, notify_id)"
    ")" PAY_TABLE,
    "CREATE TABLE IF NOT EXISTS ledger_entries ("
    " id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,"
    " merchant_id VARCHAR(64) NOT NULL,"
    " currency VARCHAR(8) NOT NULL,"
    " amount BIGINT NOT NULL CHECK (amount <> 0),"
    " kind VARCHAR(32) NOT NULL,"
    " ref_id VARCHAR(64) NOT NULL,"
    " created_at BIGINT NOT NULL,"
    " UNIQUE KEY ledger_entries_ref (kind, ref_id, merchant_id),"
    " KEY ledger_entries_merchant (merchant_id, currency),"
    " FOREIGN KEY (merchant_id) REFERENCES merchants (id)"
    ")" PAY_TABLE,
    "CREATE TABLE IF NOT EXISTS balances ("
    " merchant_id VARCHAR(64) NOT NULL,"
    " currency VARCHAR(8) NOT NULL,"
    " amount BIGINT NOT NULL CHECK (amount >= 0),"
    " PRIMARY KEY (merchant_id, currency),"
    " FOREIGN KEY (merchant_id) REFERENCES merchants (id)"
    ")" PAY_TABLE,
    NULL,
};

/*
 * 3: operations, as sqlite.c's migration 3: idemd's flushed outcome
 * counters and the reconciliation rows; keys utf8mb4_nopad_bin.
 */
static const char *const migration_3[] = {
    "CREATE TABLE IF NOT EXISTS idem_stats ("
    " instance_id VARCHAR(64) NOT NULL,"
    " interval_start BIGINT NOT NULL,"
    " interval_end BIGINT NOT NULL,"
    " business_type VARCHAR(64) NOT NULL,"
    " outcome VARCHAR(16) NOT NULL,"
    " n BIGINT NOT NULL CHECK (n >= 0),"
    " PRIMARY KEY (instance_id, interval_start, business_type, outcome),"
    " KEY idem_stats_end (interval_end)"
    ")" PAY_TABLE,
    "CREATE TABLE IF NOT EXISTS recon_rows ("
    " channel VARCHAR(64) NOT NULL,"
    " channel_txn_id VARCHAR(255) NOT NULL,"
    " merchant_id VARCHAR(64) NOT NULL,"
    " merchant_order_no VARCHAR(128) NOT NULL,"
    " amount BIGINT NOT NULL,"
    " currency VARCHAR(8) NOT NULL,"
    " status VARCHAR(16) NOT NULL CHECK (status IN ('SUCCESS','FAILED')),"
    " paid_at VARCHAR(64) NOT NULL,"
    " result VARCHAR(16) NOT NULL"
    "  CHECK (result IN ('matched','mismatched','missing_local')),"
    " payment_id VARCHAR(64) NULL,"
    " detail VARCHAR(255) NULL,"
    " imported_at BIGINT NOT NULL,"
    " UNIQUE KEY recon_rows_txn (channel, channel_txn_id)"
    ")" PAY_TABLE,
    NULL,
};

/* 4: connected channels (CHANNEL.md): see schema_sqlite.c. Each statement
 * can run again (IF NOT EXISTS; MODIFY restates the column). */
static const char *const migration_4[] = {
    "ALTER TABLE channels ADD COLUMN IF NOT EXISTS base_url VARCHAR(512) NULL",
    "ALTER TABLE channels ADD COLUMN IF NOT EXISTS timeout_ms BIGINT NOT NULL DEFAULT 5000",
    "ALTER TABLE payments MODIFY status VARCHAR(32) NOT NULL CHECK (status IN ('creating',"
    " 'processing','succeeded','failed','partially_refunded','refunded'))",
    "ALTER TABLE payments ADD COLUMN IF NOT EXISTS idem_key VARCHAR(255) CHARACTER SET utf8mb4"
    " COLLATE utf8mb4_nopad_bin NULL",
    "ALTER TABLE payments ADD COLUMN IF NOT EXISTS channel_code VARCHAR(64) NULL",
    "CREATE INDEX IF NOT EXISTS payments_status ON payments (status, updated_at)",
    "ALTER TABLE refunds ADD COLUMN IF NOT EXISTS channel_refund_id VARCHAR(255) NULL",
    "ALTER TABLE refunds ADD COLUMN IF NOT EXISTS idem_key VARCHAR(255) CHARACTER SET utf8mb4"
    " COLLATE utf8mb4_nopad_bin NULL",
    "ALTER TABLE refunds ADD COLUMN IF NOT EXISTS updated_at BIGINT NULL",
    "ALTER TABLE refunds ADD COLUMN IF NOT EXISTS channel_code VARCHAR(64) NULL",
    "CREATE INDEX IF NOT EXISTS refunds_status ON refunds (status, updated_at)",
    "CREATE TABLE IF NOT EXISTS sweeper_lease ("
    " name VARCHAR(64) NOT NULL PRIMARY KEY,"
    " holder VARCHAR(64) NOT NULL,"
    " lease_until BIGINT NOT NULL"
    ")" PAY_TABLE,
    NULL,
};

/* 5: the shard directory: see schema_sqlite.c. Rerunnable (IF NOT EXISTS,
 * INSERT IGNORE). */
static const char *const migration_5[] = {
    "CREATE TABLE IF NOT EXISTS merchant_shards ("
    " merchant_id VARCHAR(64) NOT NULL PRIMARY KEY,"
    " shard INT NOT NULL CHECK (shard BETWEEN 0 AND 999),"
    " created_at BIGINT NOT NULL"
    ")" PAY_TABLE,
    "INSERT IGNORE INTO merchant_shards (merchant_id, shard, created_at)"
    " SELECT id, 0, created_at FROM merchants",
    NULL,
};

/* 6: transfers between shards: see schema_sqlite.c. */
static const char *const migration_6[] = {
    "CREATE TABLE IF NOT EXISTS transfer_outbox ("
    " id VARCHAR(64) NOT NULL PRIMARY KEY,"
    " transfer_no VARCHAR(128) NOT NULL,"
    " from_merchant VARCHAR(64) NOT NULL,"
    " to_merchant VARCHAR(64) NOT NULL,"
    " to_shard INT NOT NULL CHECK (to_shard BETWEEN 0 AND 999),"
    " amount BIGINT NOT NULL CHECK (amount > 0),"
    " currency VARCHAR(8) NOT NULL,"
    " status VARCHAR(16) NOT NULL CHECK (status IN ('pending','succeeded','reversed')),"
    " fingerprint VARCHAR(64) NOT NULL,"
    " created_at BIGINT NOT NULL,"
    " updated_at BIGINT NOT NULL,"
    " UNIQUE KEY transfer_outbox_no (from_merchant, transfer_no),"
    " KEY transfer_outbox_status (status, updated_at),"
    " FOREIGN KEY (from_merchant) REFERENCES merchants (id)"
    ")" PAY_TABLE,
    NULL,
};

const char *const *const idem__my_migrations[] = {migration_1, migration_2, migration_3,
                                                  migration_4, migration_5, migration_6};

_Static_assert(sizeof(idem__my_migrations) / sizeof(idem__my_migrations[0]) ==
                   IDEM__MY_SCHEMA_LATEST,
               "schema_mariadb.c: bump IDEM__MY_SCHEMA_LATEST with each migration");

/* One batch through the expires_at index; a live lease is never purged.
 * MariaDB takes no LIMIT in an IN subquery, but DELETE has its own. */
const char idem__my_purge_sql[] =
    "DELETE FROM idem_records WHERE expires_at <= ?"
    " AND (status <> 'PROCESSING' OR lease_until <= ?) ORDER BY expires_at LIMIT ?";
