/*
 * cli/cli.h: idemctl's command table. Each command lives in its own file
 * and gets the parsed global options; it prints results on stdout, one-line
 * errors on stderr, and returns an exit code:
 *   0 success, 1 failure (store, I/O), 2 bad usage, 3 a check failed.
 * Commands hold no SQL: everything goes through the library's public API.
 */
#ifndef IDEM_CLI_H
#define IDEM_CLI_H

#include <jansson.h>
#include <stdio.h>

#include "idem/admin.h"
#include "idem/idem.h"

#define EXIT_USAGE 2
#define EXIT_CHECK 3

#define CLI_MAX_SHARDS 64

typedef struct {
	const char *db;              /* --db URL or IDEM_DB: shard 0 */
	int json;                    /* --json */
	const char *secret_key_file; /* --secret-key-file PATH or IDEM_SECRET_KEY_FILE */
	/* --db given again: shards 1.. in order (docs/scaling.md, "Sharding"). */
	const char *shard_db[CLI_MAX_SHARDS];
	int nshards; /* stores named: 1 + the extra --db */
} cli_globals;

/* After cli_open: every shard's store, shard 0 first (the *store returned). */
extern idem_store *cli_stores[CLI_MAX_SHARDS];
extern int cli_nstores;

typedef struct {
	const char *name; /* "merchant add" */
	const char *summary;
	const char *usage; /* shown by --help, with an example */
	int (*run)(const cli_globals *g, int argc, char **argv);
} cli_command;

extern const cli_command cli_migrate, cli_merchant_add, cli_merchant_list, cli_merchant_rotate_key,
    cli_channel_add, cli_channel_connect, cli_channel_list, cli_channel_rotate_secret,
    cli_channel_rekey, cli_purge, cli_stats, cli_inspect, cli_recon_import, cli_demo;

/* Open the store (every shard's, when --db was given several times) and the
 * payment domain over them; prints a one-line error on failure and returns
 * the exit code (0 when open). */
int cli_open(const cli_globals *g, idem_store **store, idem_pay **pay);
/* The same with store options (migrate off, group commit for imports). */
int cli_open_opts(const cli_globals *g, const idem_store_opts *opts, idem_store **store,
                  idem_pay **pay);
void cli_close(idem_store *store, idem_pay *pay);
/* Read the key file and give it to pay (checked against the stored secrets). */
int cli_use_secret_key(idem_pay *pay, const char *path);
/* Print "idemctl: what: <idem error>" and return 1. */
int cli_fail(const char *what, int rc);
/* Print "idemctl: <message> (see --help)" and return EXIT_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- helpers (util.c) ---- */

/* A decimal integer in [min, max], nothing else; -1 otherwise. */
int cli_parse_long(const char *s, long min, long max, long *out);
/* A duration: a positive number with an optional unit ms, s, m, h, d (plain: seconds). */
int cli_parse_duration_ms(const char *s, int64_t *out);
/* The value of option name at argv[*i] ("--name V" or "--name=V"), advancing *i;
 * NULL when argv[*i] is not that option. *missing is set when the value is absent. */
const char *cli_opt_value(int argc, char **argv, int *i, const char *name, int *missing);
/* RFC 3339 UTC with milliseconds. */
void cli_time(char out[32], int64_t ms);
/* Print obj compactly on stdout and release it; 1 when it could not be built. */
int cli_print_json(json_t *obj);

/* `<noun> list` (merchant list, channel list): the state an entry callback
 * gets. Under --json each entry is appended to list; else printed as a row. */
typedef struct {
	int json;
	json_t *list;
	int64_t n; /* entries seen */
} cli_list;

/* Run `<noun> list`: no arguments; the header row (text only, from fmt and
 * its column names), every entry through entry (ctx: a cli_list), then
 * "N <noun>s", or under --json {"<noun>s": [...]}. Returns the exit code. */
int cli_list_run(const cli_globals *g, int argc, const char *noun,
                 int (*list)(idem_pay *pay, idem_admin_entry_fn fn, void *ctx),
                 idem_admin_entry_fn entry, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* A progress line on stderr, drawn only when stderr is a terminal. */
typedef struct {
	int on;
	const char *label;
	int64_t total; /* 0: unknown (no bar, counts only) */
	int64_t last_draw_ms;
} cli_progress;

void cli_progress_start(cli_progress *p, const char *label, int64_t total);
/* done of total; extra: what to show after the bar (may be NULL). */
void cli_progress_update(cli_progress *p, int64_t done, const char *extra);
/* Clear the line. */
void cli_progress_end(cli_progress *p);

#endif
