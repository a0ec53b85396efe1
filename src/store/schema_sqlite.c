/*
 * store/schema_sqlite.c: the SQLite schema, one string per version (the
 * payment domain's tables with it), and the purge statement. Statement text
 * only; sqlite.c runs it. A new version is appended here, never edited in
 * place, and IDEM__SQLITE_SCHEMA_LATEST (schema.h) bumped with it.
 */
#include "store/schema.h"

const char *const idem__sqlite_migrations[] = {
    /* 1: idempotency records. Keys compare with SQLite's BINARY collation:
     * byte for byte, never trimmed or case-folded. */
    "CREATE TABLE idem_records ("
    " id INTEGER PRIMARY KEY,"
    " scope TEXT NOT NULL CHECK (length(scope) BETWEEN 1 AND 128),"
    " business_type TEXT NOT NULL CHECK (length(business_type) BETWEEN 1 AND 64),"
    " idem_key TEXT NOT NULL CHECK (length(idem_key) BETWEEN 1 AND 255),"
    " version INTEGER NOT NULL,"
    " status TEXT NOT NULL CHECK (status IN ('PROCESSING','SUCCEEDED','FAILED')),"
    " fingerprint TEXT NOT NULL,"
    " owner TEXT,"
    " http_status INTEGER,"
    " response BLOB,"
    " lease_until INTEGER,"
    " created_at INTEGER NOT NULL,"
    " expires_at INTEGER NOT NULL,"
    " completed_at INTEGER"
    ");"
    "CREATE UNIQUE INDEX idem_records_key ON idem_records (scope, business_type, idem_key);"
    "CREATE INDEX idem_records_expiry ON idem_records (expires_at);",

    /* 2: the payment domain (src/pay). Business unique indexes are the
     * last line of defence behind the idempotency records (DESIGN.md §3.5);
     * ledger_entries' (kind, ref_id, merchant_id) makes a second credit for
     * one event impossible even if everything above it failed. */
    "CREATE TABLE merchants ("
    " id TEXT PRIMARY KEY,"
    " name TEXT NOT NULL,"
    " key_id TEXT NOT NULL UNIQUE,"
    " key_digest TEXT NOT NULL,"
    " lock_version INTEGER NOT NULL DEFAULT 0,"
    " created_at INTEGER NOT NULL"
    ");"
    "CREATE TABLE channels ("
    " name TEXT PRIMARY KEY,"
    " secret TEXT NOT NULL,"
    " created_at INTEGER NOT NULL"
    ");"
    "CREATE TABLE payments ("
    " id TEXT PRIMARY KEY,"
    " merchant_id TEXT NOT NULL REFERENCES merchants (id),"
    " merchant_order_no TEXT NOT NULL,"
    " amount INTEGER NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000000),"
    " currency TEXT NOT NULL CHECK (length(currency) = 3),"
    " channel TEXT NOT NULL REFERENCES channels (name),"
    " description TEXT,"
    " metadata TEXT,"
    " status TEXT NOT NULL CHECK (status IN ('processing','succeeded','failed',"
    "  'partially_refunded','refunded')),"
    " refunded_amount INTEGER NOT NULL CHECK (refunded_amount BETWEEN 0 AND amount),"
    " channel_txn_id TEXT,"
    " fingerprint TEXT NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " updated_at INTEGER NOT NULL,"
    " UNIQUE (merchant_id, merchant_order_no)"
    ");"
    "CREATE TABLE refunds ("
    " id TEXT PRIMARY KEY,"
    " merchant_id TEXT NOT NULL REFERENCES merchants (id),"
    " refund_request_no TEXT NOT NULL,"
    " payment_id TEXT NOT NULL REFERENCES payments (id),"
    " amount INTEGER NOT NULL CHECK (amount > 0),"
    " currency TEXT NOT NULL,"
    " reason TEXT,"
    " status TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " UNIQUE (merchant_id, refund_request_no)"
    ");"
    "CREATE TABLE transfers ("
    " id TEXT PRIMARY KEY,"
    " transfer_no TEXT NOT NULL,"
    " from_merchant TEXT NOT NULL REFERENCES merchants (id),"
    " to_merchant TEXT NOT NULL REFERENCES merchants (id),"
    " amount INTEGER NOT NULL CHECK (amount > 0),"
    " currency TEXT NOT NULL,"
    " status TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " UNIQUE (from_merchant, transfer_no)"
    ");"
    "CREATE TABLE notifications ("
    " channel TEXT NOT NULL,"
    " notify_id TEXT NOT NULL,"
    " payment_id TEXT NOT NULL,"
    " channel_txn_id TEXT NOT NULL,"
    " status TEXT NOT NULL,"
    " amount INTEGER NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " UNIQUE (channel, notify_id)"
    ");"
    "CREATE TABLE ledger_entries ("
    " id INTEGER PRIMARY KEY,"
    " merchant_id TEXT NOT NULL REFERENCES merchants (id),"
    " currency TEXT NOT NULL,"
    " amount INTEGER NOT NULL CHECK (amount <> 0),"
    " kind TEXT NOT NULL,"
    " ref_id TEXT NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " UNIQUE (kind, ref_id, merchant_id)"
    ");"
    "CREATE INDEX ledger_entries_merchant ON ledger_entries (merchant_id, currency);"
    "CREATE TABLE balances ("
    " merchant_id TEXT NOT NULL REFERENCES merchants (id),"
    " currency TEXT NOT NULL,"
    " amount INTEGER NOT NULL CHECK (amount >= 0),"
    " PRIMARY KEY (merchant_id, currency)"
    ");",

    /* 3: operations (src/pay/stats.c, src/pay/recon.c). idem_stats holds
     * each idemd instance's outcome counters, one row per instance,
     * interval, business type and outcome, flushed every few seconds:
     * never a write per request. recon_rows records each row of a
     * channel's reconciliation file once: (channel, channel_txn_id) is the
     * business unique index behind the "recon" idempotency records. */
    "CREATE TABLE idem_stats ("
    " instance_id TEXT NOT NULL,"
    " interval_start INTEGER NOT NULL,"
    " interval_end INTEGER NOT NULL,"
    " business_type TEXT NOT NULL,"
    " outcome TEXT NOT NULL,"
    " n INTEGER NOT NULL CHECK (n >= 0),"
    " PRIMARY KEY (instance_id, interval_start, business_type, outcome)"
    ");"
    "CREATE INDEX idem_stats_end ON idem_stats (interval_end);"
    "CREATE TABLE recon_rows ("
    " channel TEXT NOT NULL,"
    " channel_txn_id TEXT NOT NULL,"
    " merchant_id TEXT NOT NULL,"
    " merchant_order_no TEXT NOT NULL,"
    " amount INTEGER NOT NULL,"
    " currency TEXT NOT NULL,"
    " status TEXT NOT NULL CHECK (status IN ('SUCCESS','FAILED')),"
    " paid_at TEXT NOT NULL,"
    " result TEXT NOT NULL CHECK (result IN ('matched','mismatched','missing_local')),"
    " payment_id TEXT,"
    " detail TEXT,"
    " imported_at INTEGER NOT NULL,"
    " UNIQUE (channel, channel_txn_id)"
    ");",

    /* 4: connected channels (CHANNEL.md). A channel with a base_url is
     * called by idemd; a payment on it is 'creating' from the committed
     * claim until the channel gives a definite answer. SQLite cannot alter
     * a CHECK, so payments is rebuilt (the documented 12-step procedure:
     * sqlite.c runs migrations with foreign keys off and checks them before
     * COMMIT). idem_key is the claim's key, so the sweeper can settle a
     * record its owner left PROCESSING and a retry under it gets its own
     * answer; channel_code is the channel's refusal of a failed payment.
     * sweeper_lease holds one row per background task: whoever holds it
     * unexpired runs it. */
    "ALTER TABLE channels ADD COLUMN base_url TEXT;"
    "ALTER TABLE channels ADD COLUMN timeout_ms INTEGER NOT NULL DEFAULT 5000;"
    "CREATE TABLE payments_v4 ("
    " id TEXT PRIMARY KEY,"
    " merchant_id TEXT NOT NULL REFERENCES merchants (id),"
    " merchant_order_no TEXT NOT NULL,"
    " amount INTEGER NOT NULL CHECK (amount BETWEEN 1 AND 1000000000000000),"
    " currency TEXT NOT NULL CHECK (length(currency) = 3),"
    " channel TEXT NOT NULL REFERENCES channels (name),"
    " description TEXT,"
    " metadata TEXT,"
    " status TEXT NOT NULL CHECK (status IN ('creating','processing','succeeded','failed',"
    "  'partially_refunded','refunded')),"
    " refunded_amount INTEGER NOT NULL CHECK (refunded_amount BETWEEN 0 AND amount),"
    " channel_txn_id TEXT,"
    " fingerprint TEXT NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " updated_at INTEGER NOT NULL,"
    " idem_key TEXT,"
    " channel_code TEXT,"
    " UNIQUE (merchant_id, merchant_order_no)"
    ");"
    "INSERT INTO payments_v4 (id, merchant_id, merchant_order_no, amount, currency, channel,"
    " description, metadata, status, refunded_amount, channel_txn_id, fingerprint, created_at,"
    " updated_at) SELECT id, merchant_id, merchant_order_no, amount, currency, channel,"
    " description, metadata, status, refunded_amount, channel_txn_id, fingerprint, created_at,"
    " updated_at FROM payments;"
    "DROP TABLE payments;"
    "ALTER TABLE payments_v4 RENAME TO payments;"
    "CREATE INDEX payments_status ON payments (status, updated_at);"
    "ALTER TABLE refunds ADD COLUMN channel_refund_id TEXT;"
    "ALTER TABLE refunds ADD COLUMN idem_key TEXT;"
    "ALTER TABLE refunds ADD COLUMN updated_at INTEGER;"
    "ALTER TABLE refunds ADD COLUMN channel_code TEXT;"
    "CREATE INDEX refunds_status ON refunds (status, updated_at);"
    "CREATE TABLE sweeper_lease ("
    " name TEXT PRIMARY KEY,"
    " holder TEXT NOT NULL,"
    " lease_until INTEGER NOT NULL"
    ");",

    /* 5: the shard directory (docs/scaling.md, Sharding): which shard each
     * merchant lives on, read on shard 0 only. A merchant never moves, so
     * the rows are written once; the ones that exist already live here. */
    "CREATE TABLE merchant_shards ("
    " merchant_id TEXT PRIMARY KEY,"
    " shard INTEGER NOT NULL CHECK (shard BETWEEN 0 AND 999),"
    " created_at INTEGER NOT NULL"
    ");"
    "INSERT INTO merchant_shards (merchant_id, shard, created_at)"
    " SELECT id, 0, created_at FROM merchants;",

    /* 6: transfers between shards (pay/saga.c): the payer's shard keeps the
     * transfer and its outbox state; the payee lives on another shard, so
     * to_merchant has no foreign key. */
    "CREATE TABLE transfer_outbox ("
    " id TEXT PRIMARY KEY,"
    " transfer_no TEXT NOT NULL,"
    " from_merchant TEXT NOT NULL REFERENCES merchants (id),"
    " to_merchant TEXT NOT NULL,"
    " to_shard INTEGER NOT NULL CHECK (to_shard BETWEEN 0 AND 999),"
    " amount INTEGER NOT NULL CHECK (amount > 0),"
    " currency TEXT NOT NULL,"
    " status TEXT NOT NULL CHECK (status IN ('pending','succeeded','reversed')),"
    " fingerprint TEXT NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " updated_at INTEGER NOT NULL,"
    " UNIQUE (from_merchant, transfer_no)"
    ");"
    "CREATE INDEX transfer_outbox_status ON transfer_outbox (status, updated_at);",

    /* 7: the same CHECK constraints, written without IN lists. SQLite codes
     * a CHECK `x IN (...)` of three or more constants as an ephemeral
     * b-tree, built anew by every INSERT and UPDATE that checks it (about
     * 9,000 instructions each: three per first payment, 12 % of what the
     * group-commit writer does for one); `x = 'a' OR x = 'b' ...` is the
     * same constraint without it. Every row satisfies both, so the text is
     * changed in place, the procedure SQLite documents for changing
     * constraints (lang_altertable.html, "Making Other Kinds Of Table Schema
     * Changes"), no table rebuilt: instant at any size. sqlite.c bumps the
     * schema cookie after a migration that writes the schema, so every
     * connection parses the new text. A table whose text differs (edited
     * by hand) keeps its constraint as it is: correct, only slower. */
    "PRAGMA writable_schema=ON;"
    "UPDATE sqlite_master SET sql = replace(sql, 'status IN "
    "(''PROCESSING'',''SUCCEEDED'',''FAILED'')',"
    " '(status = ''PROCESSING'' OR status = ''SUCCEEDED'' OR status = ''FAILED'')')"
    " WHERE type = 'table' AND name = 'idem_records';"
    "UPDATE sqlite_master SET sql = replace(sql, 'status IN "
    "(''creating'',''processing'',''succeeded'',''failed'',  ''partially_refunded'',''refunded'')',"
    " '(status = ''creating'' OR status = ''processing'' OR status = ''succeeded'' OR status = "
    "''failed'' OR status = ''partially_refunded'' OR status = ''refunded'')')"
    " WHERE type = 'table' AND name = 'payments';"
    "UPDATE sqlite_master SET sql = replace(sql, 'result IN "
    "(''matched'',''mismatched'',''missing_local'')',"
    " '(result = ''matched'' OR result = ''mismatched'' OR result = ''missing_local'')')"
    " WHERE type = 'table' AND name = 'recon_rows';"
    "UPDATE sqlite_master SET sql = replace(sql, 'status IN "
    "(''pending'',''succeeded'',''reversed'')',"
    " '(status = ''pending'' OR status = ''succeeded'' OR status = ''reversed'')')"
    " WHERE type = 'table' AND name = 'transfer_outbox';"
    "PRAGMA writable_schema=OFF;",
};

_Static_assert(sizeof(idem__sqlite_migrations) / sizeof(idem__sqlite_migrations[0]) ==
                   IDEM__SQLITE_SCHEMA_LATEST,
               "schema_sqlite.c: bump IDEM__SQLITE_SCHEMA_LATEST with each migration");

/* One batch through the expires_at index; a live lease is never purged.
 * Standard SQL: PostgreSQL runs it too. */
const char idem__purge_sql[] =
    "DELETE FROM idem_records WHERE id IN (SELECT id FROM idem_records"
    " WHERE expires_at <= ? AND (status <> 'PROCESSING' OR lease_until <= ?)"
    " ORDER BY expires_at LIMIT ?)";
