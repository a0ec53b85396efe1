/*
 * tests/fuzz/fuzz_fingerprint.c: the canonical-JSON request fingerprint
 * (src/core/fingerprint.c). Any bytes: no crash, a 64-hex answer or a clean
 * error; and the fingerprint is canonical: the body re-serialised (other
 * key order, other spacing) has the same fingerprint.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_env.h"

static void check_hex(const char *fp)
{
	if (strlen(fp) != 64)
		fuzz_fail("fingerprint is not 64 characters");
	for (int i = 0; i < 64; i++)
		if (!strchr("0123456789abcdef", fp[i]))
			fuzz_fail("fingerprint is not lower-case hex");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char fp[65], fp2[65];
	json_t *doc;
	char *other;
	int rc;

	rc = idem_fingerprint(fp, "POST", "/v1/payments", (const char *)data, size);
	if (rc < 0) {
		if (fp[0] != '\0')
			fuzz_fail("failed fingerprint left output behind");
		return 0;
	}
	check_hex(fp);
	if (size == 0)
		return 0;
	/* The same document written another way must hash the same. */
	doc = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, NULL);
	if (!doc)
		fuzz_fail("fingerprint accepted what jansson rejects");
	other = json_dumps(doc, JSON_INDENT(3) | JSON_ENCODE_ANY);
	json_decref(doc);
	if (!other)
		return 0;
	if (idem_fingerprint(fp2, "POST", "/v1/payments", other, strlen(other)) < 0)
		fuzz_fail("re-serialised body not fingerprinted");
	if (strcmp(fp, fp2) != 0)
		fuzz_fail("fingerprint depends on formatting");
	if (idem_fingerprint(fp2, "POST", "/v1/refunds", other, strlen(other)) == 0 &&
	    strcmp(fp, fp2) == 0)
		fuzz_fail("fingerprint ignores the path");
	free(other);
	return 0;
}
