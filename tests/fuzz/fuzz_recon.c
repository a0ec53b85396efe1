/*
 * tests/fuzz/fuzz_recon.c: reconciliation CSV rows (src/pay/recon.c, on
 * libcsv) through idem_recon_import on a SQLite store. Byte 0 odd: the
 * header row is put in front, so the fuzzer reaches the rows. The counts
 * must add up: rows = inserted + duplicates + invalid, inserted = matched +
 * mismatched + missing_local, and every invalid row was reported once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_env.h"
#include "idem/admin.h"

static void on_invalid(void *ctx, int64_t line, const char *reason)
{
	if (line < 1 || !reason || !*reason)
		fuzz_fail("invalid row reported without a line or a reason");
	(*(int64_t *)ctx)++;
}

static void on_mismatch(void *ctx, const idem_recon_mismatch *m)
{
	(void)ctx;
	if (m->line < 2 || !m->channel_txn_id || !m->detail)
		fuzz_fail("mismatch reported without its fields");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char header[] = IDEM_RECON_HEADER "\n";
	fuzz_env *e = fuzz_env_get();
	idem_recon_opts opts = IDEM_RECON_OPTS_INIT;
	idem_recon_report rep;
	int64_t invalid = 0;
	size_t rows_len, n;
	char *rows, *text;
	FILE *f;
	int rc;

	if (size < 1)
		return 0;
	rows = fuzz_subst(data + 1, size - 1, &rows_len);
	n = (data[0] & 1 ? sizeof(header) - 1 : 0) + rows_len;
	if (!(text = malloc(n + 1)))
		fuzz_fail("out of memory");
	if (data[0] & 1)
		memcpy(text, header, sizeof(header) - 1);
	memcpy(text + n - rows_len, rows, rows_len);
	free(rows);
	if (!(f = n ? fmemopen(text, n, "rb") : fopen("/dev/null", "rb")))
		fuzz_fail("fmemopen failed");
	opts.on_invalid = on_invalid;
	opts.on_mismatch = on_mismatch;
	opts.ctx = &invalid;
	opts.max_in_flight = 1 + data[0] / 2 % 8;
	memset(&rep, 0, sizeof(rep));
	rc = idem_recon_import(&rep, e->pay, e->channel, f, &opts);
	fclose(f);
	free(text);
	if (rc < 0 && rc != IDEM_EINVAL)
		fuzz_fail(idem_error_last()->message);
	if (rc == 0) {
		if (rep.rows != rep.inserted + rep.duplicates + rep.invalid)
			fuzz_fail("rows != inserted + duplicates + invalid");
		if (rep.inserted != rep.matched + rep.mismatched + rep.missing_local)
			fuzz_fail("inserted != matched + mismatched + missing_local");
		if (rep.invalid != invalid)
			fuzz_fail("invalid count differs from the rows reported");
	}
	return 0;
}
