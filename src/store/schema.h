/*
 * store/schema.h: each dialect's schema (the idempotency records, the
 * payment domain's tables, operations tables) and its purge statement, kept
 * apart from the drivers that run them (schema_<dialect>.c). Statement text
 * only: no driver types, nothing that executes.
 */
#ifndef IDEM_STORE_SCHEMA_H
#define IDEM_STORE_SCHEMA_H

/* Versions each dialect knows; each file checks its list against these. */
#define IDEM__SQLITE_SCHEMA_LATEST 7
#define IDEM__PG_SCHEMA_LATEST     6
#define IDEM__MY_SCHEMA_LATEST     6

/* Version v is [v - 1]: one script (SQLite, PostgreSQL run it whole). */
extern const char *const idem__sqlite_migrations[];
extern const char *const idem__pg_migrations[];
/* MariaDB: a NULL-terminated list of statements per version (DDL commits
 * implicitly, so each is applied and rerunnable on its own). */
extern const char *const *const idem__my_migrations[];

/* Delete one batch of expired records: parameters now, now, batch size.
 * SQLite and PostgreSQL run the same text (schema_sqlite.c); MariaDB takes no
 * LIMIT in an IN subquery and has its own. */
extern const char idem__purge_sql[];
extern const char idem__my_purge_sql[];

#endif
