/*
 * tests/security/test_secretbox.c: the sealed format of channel secrets
 * (util/secretbox.c): it round-trips, every seal differs (fresh nonce),
 * nothing of the plaintext shows, and any change (a byte of nonce,
 * ciphertext or tag, the associated data, the key, truncation, bad base64,
 * no prefix) fails to open with IDEM_EINVAL, never with a wrong plaintext.
 * And the key file rules: 32 bytes or 64 hex digits, mode 600 or stricter.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support.h"
#include "util/secretbox.h"

static const unsigned char key[32] = "0123456789abcdef0123456789abcdef";
static const char plain[] = "4f1c0a9d3e6b8f7a2c5d1e0b9a8f7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b";

static void test_round_trip_and_fresh_nonces(void **state)
{
	char a[256], b[256], out[128];
	size_t n = 0;

	(void)state;
	assert_int_equal(idem__secretbox_seal(key, "wx", plain, strlen(plain), a, sizeof(a)), 0);
	assert_int_equal(idem__secretbox_seal(key, "wx", plain, strlen(plain), b, sizeof(b)), 0);
	assert_true(idem__secretbox_is_sealed(a));
	assert_true(strncmp(a, "v1:", 3) == 0);
	assert_int_equal(strlen(a) + 1, IDEM_SECRETBOX_SEALED_SIZE(strlen(plain)));
	assert_string_not_equal(a, b); /* a fresh nonce each time */
	assert_null(strstr(a, plain));
	assert_int_equal(idem__secretbox_open(key, "wx", a, out, sizeof(out), &n), 0);
	assert_int_equal(n, strlen(plain));
	assert_string_equal(out, plain);
	assert_int_equal(idem__secretbox_open(key, "wx", b, out, sizeof(out), &n), 0);
	assert_string_equal(out, plain);
	assert_false(idem__secretbox_is_sealed(plain));
	/* Too small an output buffer is refused, not overrun. */
	assert_int_equal(idem__secretbox_seal(key, "wx", plain, strlen(plain), a, 100),
	                 IDEM_EINVAL);
	assert_int_equal(idem__secretbox_seal(key, "wx", plain, strlen(plain), b, sizeof(b)), 0);
	assert_int_equal(idem__secretbox_open(key, "wx", b, out, 10, &n), IDEM_EINVAL);
}

static void assert_does_not_open(const unsigned char *k, const char *aad, const char *sealed)
{
	char out[128];
	size_t n = 99;

	memset(out, 'x', sizeof(out));
	assert_int_equal(idem__secretbox_open(k, aad, sealed, out, sizeof(out), &n), IDEM_EINVAL);
	assert_int_equal(n, 0);
	assert_string_equal(out, "");
}

static void test_any_change_fails_to_open(void **state)
{
	static const char b64[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	unsigned char other[32];
	char s[256], t[256];
	size_t len;

	(void)state;
	assert_int_equal(idem__secretbox_seal(key, "wx", plain, strlen(plain), s, sizeof(s)), 0);
	len = strlen(s);
	memcpy(other, key, 32);
	other[31] ^= 1;
	assert_does_not_open(other, "wx", s);
	assert_does_not_open(key, "wy", s);
	assert_does_not_open(key, "", s);
	/* Every base64 digit changed in turn (nonce, ciphertext and tag). */
	for (size_t i = 3; i < len; i++) {
		if (s[i] == '=')
			continue;
		memcpy(t, s, len + 1);
		t[i] = strchr(b64, s[i]) == b64 ? 'B' : 'A';
		/* The last digit before padding may carry unused bits: skip no-ops. */
		if (i + 1 < len && s[i + 1] == '=')
			continue;
		assert_does_not_open(key, "wx", t);
	}
	memcpy(t, s, len + 1);
	t[len - 4] = '\0'; /* truncated */
	assert_does_not_open(key, "wx", t);
	assert_does_not_open(key, "wx", "v1:");
	assert_does_not_open(key, "wx", "v1:!!!!");
	assert_does_not_open(key, "wx", "v1:AAAA");
	assert_does_not_open(key, "wx", "v1:AA=A");
	assert_does_not_open(key, "wx", plain); /* no prefix */
	memcpy(t, s, len + 1);
	t[1] = '2'; /* another version */
	assert_does_not_open(key, "wx", t);
}

static char *key_file(const char *tmp, const void *data, size_t n, mode_t mode)
{
	static char path[512];
	int fd;

	snprintf(path, sizeof(path), "%s/key", tmp);
	unlink(path);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	close(fd);
	assert_int_equal(chmod(path, mode), 0);
	return path;
}

static void test_key_file_rules(void **state)
{
	char tmp[] = "/tmp/idem-keyfile-XXXXXX", hex[66];
	unsigned char k[32];

	(void)state;
	assert_non_null(mkdtemp(tmp));
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", key[i]);
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, key, 32, 0600), k), 0);
	assert_memory_equal(k, key, 32);
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, hex, 64, 0400), k), 0);
	assert_memory_equal(k, key, 32);
	hex[64] = '\n';
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, hex, 65, 0600), k), 0);
	assert_memory_equal(k, key, 32);
	/* Open to group or others, in any way. */
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, key, 32, 0640), k), IDEM_EINVAL);
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, key, 32, 0604), k), IDEM_EINVAL);
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, key, 32, 0620), k), IDEM_EINVAL);
	assert_non_null(strstr(idem_error_last()->message, "chmod 600"));
	/* Wrong sizes and digits. */
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, key, 31, 0600), k), IDEM_EINVAL);
	{
		unsigned char longer[33];

		memcpy(longer, key, 32);
		longer[32] = 'x';
		assert_int_equal(idem__secretbox_read_key(key_file(tmp, longer, 33, 0600), k),
		                 IDEM_EINVAL);
	}
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, hex, 63, 0600), k), IDEM_EINVAL);
	hex[3] = 'g';
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, hex, 64, 0600), k), IDEM_EINVAL);
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, "", 0, 0600), k), IDEM_EINVAL);
	/* Not a regular file; absent. */
	assert_int_equal(idem__secretbox_read_key(tmp, k), IDEM_EINVAL);
	unlink(key_file(tmp, "", 0, 0600));
	assert_int_equal(idem__secretbox_read_key(key_file(tmp, "", 0, 0600), k), IDEM_EINVAL);
	unlink(key_file(tmp, "", 0, 0600));
	assert_int_equal(idem__secretbox_read_key("/nonexistent/key", k), IDEM_EINVAL);
	assert_non_null(strstr(idem_error_last()->message, "/nonexistent/key"));
	rmdir(tmp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_round_trip_and_fresh_nonces),
	    cmocka_unit_test(test_any_change_fails_to_open),
	    cmocka_unit_test(test_key_file_rules),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
