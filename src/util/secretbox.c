/* util/secretbox.c: see secretbox.h. */
#include "util/secretbox.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idem/common.h"
#include "util/error.h"

#define NONCE      12
#define TAG        16
#define PREFIX_LEN 3
#define MAX_PLAIN  256 /* secrets are short: a bound for the stack buffers */

int idem__secretbox_is_sealed(const char *text)
{
	return text && strncmp(text, IDEM_SECRETBOX_PREFIX, PREFIX_LEN) == 0;
}

int idem__secretbox_seal(const unsigned char key[IDEM_SECRETBOX_KEY], const char *aad,
                         const void *plain, size_t n, char *out, size_t outsize)
{
	unsigned char raw[NONCE + MAX_PLAIN + TAG];
	EVP_CIPHER_CTX *ctx = NULL;
	int len = 0, fin = 0, rc = IDEM_ESTORE;

	if (outsize > 0)
		out[0] = '\0';
	if (n > MAX_PLAIN || outsize < IDEM_SECRETBOX_SEALED_SIZE(n))
		return idem__error(IDEM_EINVAL, "secretbox: value too long to seal");
	if (RAND_bytes(raw, NONCE) != 1 || !(ctx = EVP_CIPHER_CTX_new()) ||
	    EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, NONCE, NULL) != 1 ||
	    EVP_EncryptInit_ex(ctx, NULL, NULL, key, raw) != 1 ||
	    EVP_EncryptUpdate(ctx, NULL, &len, (const unsigned char *)aad, (int)strlen(aad)) != 1 ||
	    EVP_EncryptUpdate(ctx, raw + NONCE, &len, plain, (int)n) != 1 ||
	    EVP_EncryptFinal_ex(ctx, raw + NONCE + len, &fin) != 1 || (size_t)(len + fin) != n ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG, raw + NONCE + n) != 1) {
		rc = idem__error(IDEM_ESTORE, "secretbox: AES-256-GCM encryption failed");
		goto done;
	}
	memcpy(out, IDEM_SECRETBOX_PREFIX, PREFIX_LEN);
	EVP_EncodeBlock((unsigned char *)out + PREFIX_LEN, raw, (int)(NONCE + n + TAG));
	rc = 0;
done:
	EVP_CIPHER_CTX_free(ctx);
	OPENSSL_cleanse(raw, sizeof(raw));
	return rc;
}

int idem__secretbox_open(const unsigned char key[IDEM_SECRETBOX_KEY], const char *aad,
                         const char *sealed, char *out, size_t outsize, size_t *n)
{
	unsigned char raw[NONCE + MAX_PLAIN + TAG + 3];
	EVP_CIPHER_CTX *ctx = NULL;
	const char *b64;
	size_t b64len, rawlen, pad = 0;
	int len = 0, fin = 0, rc = IDEM_EINVAL;

	*n = 0;
	if (outsize > 0)
		out[0] = '\0';
	if (!idem__secretbox_is_sealed(sealed))
		return idem__error(IDEM_EINVAL, "secretbox: not a sealed value");
	b64 = sealed + PREFIX_LEN;
	b64len = strlen(b64);
	if (b64len == 0 || b64len % 4 != 0 || b64len / 4 * 3 > sizeof(raw))
		return idem__error(IDEM_EINVAL, "secretbox: malformed sealed value");
	for (size_t i = 0; i < b64len; i++) {
		char c = b64[i];

		if (c == '=' && i >= b64len - 2)
			pad++;
		else if (pad || !((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		                  (c >= '0' && c <= '9') || c == '+' || c == '/'))
			return idem__error(IDEM_EINVAL, "secretbox: malformed sealed value");
	}
	if (EVP_DecodeBlock(raw, (const unsigned char *)b64, (int)b64len) < 0)
		return idem__error(IDEM_EINVAL, "secretbox: malformed sealed value");
	rawlen = b64len / 4 * 3 - pad;
	if (rawlen < NONCE + TAG || rawlen - NONCE - TAG + 1 > outsize)
		return idem__error(IDEM_EINVAL, "secretbox: malformed sealed value");
	*n = rawlen - NONCE - TAG;
	if (!(ctx = EVP_CIPHER_CTX_new()) ||
	    EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, NONCE, NULL) != 1 ||
	    EVP_DecryptInit_ex(ctx, NULL, NULL, key, raw) != 1 ||
	    EVP_DecryptUpdate(ctx, NULL, &len, (const unsigned char *)aad, (int)strlen(aad)) != 1 ||
	    EVP_DecryptUpdate(ctx, (unsigned char *)out, &len, raw + NONCE, (int)*n) != 1 ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG, raw + NONCE + *n) != 1 ||
	    EVP_DecryptFinal_ex(ctx, (unsigned char *)out + len, &fin) != 1) {
		OPENSSL_cleanse(out, outsize);
		out[0] = '\0';
		*n = 0;
		rc = idem__error(IDEM_EINVAL,
		                 "a sealed channel secret does not open with this secret key "
		                 "(wrong key, or the value was altered)");
		goto done;
	}
	out[*n] = '\0';
	rc = 0;
done:
	EVP_CIPHER_CTX_free(ctx);
	OPENSSL_cleanse(raw, sizeof(raw));
	return rc;
}

static int hexval(unsigned char c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
	                              : -1;
}

int idem__secretbox_read_key(const char *path, unsigned char key[IDEM_SECRETBOX_KEY])
{
	unsigned char buf[2 * IDEM_SECRETBOX_KEY + 3];
	struct stat st;
	ssize_t got;
	size_t n = 0;
	int fd, rc = IDEM_EINVAL;

	memset(key, 0, IDEM_SECRETBOX_KEY);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY)) < 0)
		return idem__error(IDEM_EINVAL, "secret key file %s: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		rc = idem__error(IDEM_EINVAL, "secret key file %s: not a regular file", path);
		goto done;
	}
	if (st.st_mode & (S_IRWXG | S_IRWXO)) {
		rc = idem__error(IDEM_EINVAL,
		                 "secret key file %s: mode %03o lets others read it (chmod 600)",
		                 path, (unsigned)(st.st_mode & 0777));
		goto done;
	}
	while (n < sizeof(buf) && (got = read(fd, buf + n, sizeof(buf) - n)) != 0) {
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			rc = idem__error(IDEM_EINVAL, "secret key file %s: %s", path,
			                 strerror(errno));
			goto done;
		}
		n += (size_t)got;
	}
	if (n == IDEM_SECRETBOX_KEY) {
		memcpy(key, buf, IDEM_SECRETBOX_KEY);
		rc = 0;
		goto done;
	}
	if (n == 2 * IDEM_SECRETBOX_KEY + 1 && buf[n - 1] == '\n')
		n--;
	if (n != 2 * IDEM_SECRETBOX_KEY) {
		rc = idem__error(IDEM_EINVAL,
		                 "secret key file %s: must hold 32 bytes or 64 hex digits", path);
		goto done;
	}
	for (size_t i = 0; i < IDEM_SECRETBOX_KEY; i++) {
		int hi = hexval(buf[2 * i]), lo = hexval(buf[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			memset(key, 0, IDEM_SECRETBOX_KEY);
			rc = idem__error(IDEM_EINVAL,
			                 "secret key file %s: must hold 32 bytes or 64 hex digits",
			                 path);
			goto done;
		}
		key[i] = (unsigned char)(hi << 4 | lo);
	}
	rc = 0;
done:
	OPENSSL_cleanse(buf, sizeof(buf));
	close(fd);
	return rc;
}
