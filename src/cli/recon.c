/*
 * cli/recon.c: `idemctl recon import CHANNEL FILE.csv`: streams the file
 * through idem_recon_import and prints the report. The invalid rows and the
 * mismatches are spooled to temporary files as they come, not kept in
 * memory, so a file of any size is imported in constant memory; the JSON
 * report has exactly the members API users script against.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

#define SHOW_MISMATCHES 1000 /* listed for people; the count is always exact */

typedef struct {
	int json;
	FILE *invalid;    /* JSON array members (--json) or text lines */
	FILE *mismatches; /* text lines, without --json */
	int64_t ninvalid, nmismatch;
	int spool_error;
	cli_progress prog;
} import_ctx;

static void on_invalid(void *arg, int64_t line, const char *reason)
{
	import_ctx *c = arg;

	if (c->json) {
		json_t *o = json_pack("{s:I, s:s}", "line", (json_int_t)line, "reason", reason);
		char *s = o ? json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;

		if (!s || fprintf(c->invalid, "%s%s", c->ninvalid ? "," : "", s) < 0)
			c->spool_error = 1;
		free(s);
		json_decref(o);
	} else if (fprintf(c->invalid, "  line %lld: %s\n", (long long)line, reason) < 0) {
		c->spool_error = 1;
	}
	c->ninvalid++;
}

static void on_mismatch(void *arg, const idem_recon_mismatch *m)
{
	import_ctx *c = arg;

	if (!c->json && c->nmismatch < SHOW_MISMATCHES &&
	    fprintf(c->mismatches, "  line %lld: %s %s/%s (%s): %s\n", (long long)m->line,
	            m->channel_txn_id, m->merchant_id, m->merchant_order_no, m->payment_id,
	            m->detail) < 0)
		c->spool_error = 1;
	c->nmismatch++;
}

static void on_progress(void *arg, int64_t bytes, int64_t rows)
{
	import_ctx *c = arg;
	char extra[48];

	snprintf(extra, sizeof(extra), "%lld rows", (long long)rows);
	cli_progress_update(&c->prog, c->prog.total > 0 ? bytes : rows, extra);
}

static void copy_out(FILE *f)
{
	char buf[8192];
	size_t n;

	rewind(f);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, stdout);
}

/*
 * Open the store for an import (group commit: a batch of rows per
 * transaction, one writer: every row of a channel goes to the same writer
 * anyway) and stream in through idem_recon_import, c spooling what the
 * report lists. The exit code; *store and *pay are for cli_close either way.
 */
static int import(const cli_globals *g, const char *channel, FILE *in, import_ctx *c,
                  idem_recon_report *rep, idem_store **store, idem_pay **pay)
{
	idem_store_opts so = IDEM_STORE_OPTS_INIT;
	idem_recon_opts ro = IDEM_RECON_OPTS_INIT;
	struct stat st;
	int rc;

	so.batch_max = 256;
	so.writers = 1;
	so.read_connections = 1;
	if ((rc = cli_open_opts(g, &so, store, pay)) != 0)
		return rc;
	cli_progress_start(&c->prog, "importing",
	                   fstat(fileno(in), &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : 0);
	ro.on_invalid = on_invalid;
	ro.on_mismatch = on_mismatch;
	ro.on_progress = on_progress;
	ro.ctx = c;
	rc = idem_recon_import(rep, *pay, channel, in, &ro);
	cli_progress_end(&c->prog);
	if (rc < 0) {
		rc = cli_fail(rc == IDEM_EINVAL ? "cannot import" : "import stopped", rc);
		if (rep->rows)
			fprintf(
			    stderr,
			    "idemctl: %lld rows read before the failure; importing the file again "
			    "completes it\n",
			    (long long)rep->rows);
	}
	return rc;
}

/* The report on stdout, the spooled rows copied in; the exit code. */
static int print_report(const cli_globals *g, const idem_recon_report *rep, import_ctx *c)
{
	if (g->json) {
		printf("{\"rows\":%lld,\"inserted\":%lld,\"duplicates\":%lld,\"matched\":%lld,"
		       "\"mismatched\":%lld,\"missing_local\":%lld,\"invalid\":[",
		       (long long)rep->rows, (long long)rep->inserted, (long long)rep->duplicates,
		       (long long)rep->matched, (long long)rep->mismatched,
		       (long long)rep->missing_local);
		copy_out(c->invalid);
		printf("]}\n");
	} else {
		printf("rows %lld: inserted %lld, duplicates %lld, invalid %lld\n",
		       (long long)rep->rows, (long long)rep->inserted, (long long)rep->duplicates,
		       (long long)rep->invalid);
		printf("inserted: matched %lld, mismatched %lld, missing_local %lld\n",
		       (long long)rep->matched, (long long)rep->mismatched,
		       (long long)rep->missing_local);
		if (rep->invalid) {
			printf("invalid rows:\n");
			copy_out(c->invalid);
		}
		if (rep->mismatched) {
			printf("mismatches:\n");
			copy_out(c->mismatches);
			if (c->nmismatch > SHOW_MISMATCHES)
				printf("  ... and %lld more\n",
				       (long long)(c->nmismatch - SHOW_MISMATCHES));
		}
	}
	return fflush(stdout) == 0 ? 0 : 1;
}

static int run(const cli_globals *g, int argc, char **argv)
{
	idem_recon_report rep;
	idem_store *store = NULL;
	idem_pay *pay = NULL;
	import_ctx c;
	FILE *in = NULL;
	int rc;

	memset(&c, 0, sizeof(c));
	memset(&rep, 0, sizeof(rep));
	if (argc != 2 || argv[0][0] == '-' || (argv[1][0] == '-' && argv[1][1]))
		return cli_usage_error("recon import takes CHANNEL FILE.csv");
	in = strcmp(argv[1], "-") == 0 ? stdin : fopen(argv[1], "rb");
	if (!in) {
		fprintf(stderr, "idemctl: cannot open '%s'\n", argv[1]);
		return 1;
	}
	c.json = g->json;
	c.invalid = tmpfile();
	c.mismatches = tmpfile();
	if (!c.invalid || !c.mismatches) {
		fprintf(stderr, "idemctl: cannot create a temporary file\n");
		rc = 1;
		goto done;
	}
	if ((rc = import(g, argv[0], in, &c, &rep, &store, &pay)) != 0)
		goto done;
	if (c.spool_error || fflush(c.invalid) != 0 || fflush(c.mismatches) != 0) {
		fprintf(stderr, "idemctl: cannot write the report's temporary file\n");
		rc = 1;
		goto done;
	}
	rc = print_report(g, &rep, &c);
done:
	if (c.invalid)
		fclose(c.invalid);
	if (c.mismatches)
		fclose(c.mismatches);
	if (in && in != stdin)
		fclose(in);
	cli_close(store, pay);
	return rc;
}

const cli_command cli_recon_import = {
    "recon import",
    "import a channel's reconciliation CSV, each row recorded once",
    "recon import CHANNEL FILE.csv [--json]\n\n"
    "Streams FILE (\"-\": standard input) in constant memory. The first row must be\n"
    "the header " IDEM_RECON_HEADER "\n"
    "(a UTF-8 BOM, quoted fields, embedded commas and CRLF line ends are fine;\n"
    "lines up to 4096 bytes). status is SUCCESS or FAILED; amount is an integer in\n"
    "minor units; paid_at an RFC 3339 time. Each row is claimed through the\n"
    "(channel, channel_txn_id) index, so it is recorded once however often it\n"
    "appears, in this file or earlier imports, then compared with the merchant's\n"
    "payment of that order number: matched, mismatched, or missing_local.\n"
    "Mismatches and invalid rows (with their line numbers) are listed. A progress\n"
    "bar is drawn when stderr is a terminal. Importing a file again inserts nothing.\n"
    "--json prints exactly {\"rows\", \"inserted\", \"duplicates\", \"matched\",\n"
    "\"mismatched\", \"missing_local\", \"invalid\": [{\"line\", \"reason\"}]}.\n\n"
    "example:\n  idemctl --db sqlite:var/idem.db recon import wechat settle-20261001.csv\n",
    run,
};
