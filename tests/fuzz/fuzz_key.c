/*
 * tests/fuzz/fuzz_key.c: Idempotency-Key validation and the header's
 * Structured Fields string form (routes.c parse_idem_key), checked against
 * an independent reading of the rules: a bare token, or "..." with only
 * \\ and \" escapes and 0x20..0x7E inside; either way the key is then
 * 1..255 bytes of 0x21..0x7E. Also the natural-key and token validators.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz_env.h"
#include "server_glue.h"

static int printable_key(const char *s, size_t n, size_t max)
{
	if (n == 0 || n > max)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
			return 0;
	return 1;
}

/* The expected key of header value v (len raw bytes, NULs included;
 * optional whitespace around it stripped, RFC 9110 5.5), or -1 when
 * malformed. */
static int expect_key(const char *v, size_t len, char *out, size_t *n)
{
	size_t o = 0;

	while (len && (v[0] == ' ' || v[0] == '\t'))
		v++, len--;
	while (len && (v[len - 1] == ' ' || v[len - 1] == '\t'))
		len--;

	if (len == 0 || v[0] != '"') {
		if (len > 255 || !printable_key(v, len, 255))
			return -1;
		memcpy(out, v, len);
		*n = len;
		return 0;
	}
	for (size_t i = 1; i < len; i++) {
		unsigned char c = (unsigned char)v[i];

		if (c == '"') {
			if (i + 1 != len)
				return -1;
			*n = o;
			return printable_key(out, o, 255) ? 0 : -1;
		}
		if (c == '\\') {
			if (i + 1 >= len || (v[i + 1] != '\\' && v[i + 1] != '"'))
				return -1;
			c = (unsigned char)v[++i];
		} else if (c < 0x20 || c > 0x7e) {
			return -1;
		}
		if (o >= 256)
			return -1;
		out[o++] = (char)c;
	}
	return -1; /* no closing quote */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *v = fuzz_strndup(data, size);
	char got[IDEM_KEY_MAX + 2], want[300];
	size_t got_n = 0, want_n = 0;
	int rc, want_rc;

	/* Raw bytes, NULs included, through the length-taking validators. */
	if ((idem_key_validate(v, size) == 0) != printable_key(v, size, 255))
		fuzz_fail("idem_key_validate disagrees with the rule");
	if (idem_natural_key_validate(v, size) == 0) {
		if (size == 0 || size > 64)
			fuzz_fail("natural key of a bad length accepted");
		for (size_t i = 0; i < size; i++)
			if (!strchr(
			        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.",
			        v[i]) ||
			    v[i] == '\0')
				fuzz_fail("natural key with a bad byte accepted");
	}
	/* The header's raw bytes, as idemd's header iteration hands them over. */
	rc = glue_parse_idem_key(v, size, got, sizeof(got), &got_n);
	want_rc = expect_key(v, size, want, &want_n);
	if ((rc == 0) != (want_rc == 0))
		fuzz_fail(rc == 0 ? "malformed Idempotency-Key accepted"
		                  : "valid Idempotency-Key rejected");
	if (rc == 0 && (got_n != want_n || memcmp(got, want, got_n) != 0 || got[got_n] != '\0'))
		fuzz_fail("Idempotency-Key decoded wrongly");
	free(v);
	return 0;
}
